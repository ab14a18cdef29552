"""Chatter or a log: what a DM or a mention without a known failure is answered with."""
import pytest

from bot.engine.logshape import looks_like_log
from bot.slack.text import pasted_text, unwrap_fences


@pytest.mark.parametrize("text", [
    "hi, what can you do?",
    "why did my job fail with an error?",
    "can you look at rank 3? it died overnight",
    "my job exited with code 1, any idea?",
    "thanks! the INFO you gave was useful",
    "hello\n\nhow are you?",
])
def test_chatter_is_not_a_log(text):
    assert not looks_like_log(text)


@pytest.mark.parametrize("text", [
    "RuntimeError: CUDA error: unknown error",
    "Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\nWeirdLibError: flux capacitor",
    "[rank3]: something odd happened",
    "W1009 17:52:10.112000 4021 api.py:897] Sending process 4102 closing signal SIGTERM",
    "2024-09-11 17:52:11,320 - root - this is the end",
    "[ERROR] loader stopped",
    "srun: error: gpu-a100-17: task 5: Out Of Memory",
    "worker-1: connection reset by peer",
    "Segmentation fault (core dumped)",
])
def test_log_shaped_text_is_a_log(text):
    assert looks_like_log(text)


@pytest.mark.parametrize("sent, pasted", [
    ("```[rank3]: a\n[rank3]: b```", "[rank3]: a\n[rank3]: b"),  # Slack's composer: fences glued on
    ("```\n[rank3]: a\n```", "\n[rank3]: a\n"),
    ("died: ```[rank3]: a```", "died: \n[rank3]: a"),  # a block starting mid-line is on a line of its own
    ("Compile with `TORCH_USE_CUDA_DSA````", "Compile with `TORCH_USE_CUDA_DSA`"),
])
def test_code_fences_are_taken_off_the_lines(sent, pasted):
    assert unwrap_fences(sent) == pasted


def test_pasted_text_undoes_slacks_escaping_links_and_mentions():
    sent = "<@U0BOT> see <https://hub.example.org/x?a=1&amp;b=2> &lt;tensor&gt; &amp; more"
    assert pasted_text(sent) == " see https://hub.example.org/x?a=1&b=2 <tensor> & more"


@pytest.mark.parametrize("sent, pasted", [
    # Slack links text that looks like a domain; the label is what was typed
    ("NCCL INFO transport/<http://shm.cc:634|shm.cc:634> -&gt; 2", "NCCL INFO transport/shm.cc:634 -> 2"),
    ("bash <http://train.sh|train.sh>: line 12: 4242 Killed", "bash train.sh: line 12: 4242 Killed"),
    ("owner <mailto:ops@example.org|ops@example.org>", "owner ops@example.org"),
    ("docs <https://docs.ray.io/en/latest/|the Ray docs>", "docs the Ray docs"),
])
def test_a_link_slack_made_reads_as_its_label(sent, pasted):
    assert pasted_text(sent) == pasted


def test_an_nccl_trail_slack_linked_diagnoses_as_the_log(diagnoser):
    # the `text` of a message event for a paste outside a code block, as Slack sends it
    sent = ("vllm:40609:40744 [1] NCCL INFO transport/<http://shm.cc:634|shm.cc:634> -&gt; 2\n"
            "vllm:40609:40744 [1] NCCL INFO <http://group.cc:146|group.cc:146> -&gt; 2\n")
    got = diagnoser.diagnose_text(pasted_text(sent))
    assert got.root is not None and got.root.entry.id == "nccl-system-error"
    assert got.root.first.text.endswith("NCCL INFO group.cc:146 -> 2")

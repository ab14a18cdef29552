"""Whole-run trends judged from logged values (bot/engine/trends.py), through the real scan and
knowledge base, under every engine: divergence, NaN/Inf, fp16 loss scale and skipped steps, stalls."""
import io
import random

import pytest

from bot.engine import trends
from bot.sources.files import diagnose_streams


def _megatron(losses, scale=65536.0, skipped=0, start=10, every=10, grad="0.412"):
    out = []
    for i, loss in enumerate(losses):
        it = start + i * every
        s = scale(it) if callable(scale) else scale
        k = skipped(it) if callable(skipped) else skipped
        out.append(f"[rank7]:  iteration {it:8d}/  100000 | consumed samples: {it * 512:10d} | elapsed time per iteration (ms): 1021.4 | "
                   f"learning rate: 2.999E-04 | global batch size:   512 | lm loss: {loss:.6E} | loss scale: {s:.1f} | "
                   f"grad norm: {grad} | number of skipped iterations: {k:3d} | number of nan iterations:   0 |")
    return out


def _noise(n, seed=1):
    rng = random.Random(seed)
    return [f"node0{rng.randrange(4)}:2211:2290 [{rng.randrange(8)}] NCCL INFO Channel 0{rng.randrange(8)}/24 : 0[0] -> 1[1] via P2P/IPC"
            for _ in range(n)]


def _diagnose(diagnoser, lines):
    return diagnoser.diagnose_text("\n".join(lines) + "\n")


def _finding(d, entry_id):
    return next((f for f in d.findings if f.entry.id == entry_id), None)


def test_a_diverging_megatron_loss_is_found_at_the_line_where_it_turned(diagnoser):
    losses = [2.1 - i * 0.005 for i in range(40)] + [3.0, 4.4, 6.8, 7.9, 8.8, 9.4, 9.9, 10.3]
    lines = ["[rank0]: > building train, validation, and test datasets ..."] + _megatron(losses)
    d = _diagnose(diagnoser, lines)
    assert d.root.entry.id == "loss-spike"
    hit = d.root.first
    assert hit.line == 1 + 43 and "lm loss: 6.800000E+00" in hit.text
    assert "running level of 2" in hit.text and "to 6.8" in hit.text
    assert d.progress["iteration"] == 480


def test_a_spike_that_comes_back_val_loss_and_too_little_history_stay_silent(diagnoser):
    recovered = _megatron([2.0] * 30 + [7.5, 6.1, 2.2, 2.0, 1.9] + [1.9] * 10)
    assert _finding(_diagnose(diagnoser, recovered), "loss-spike") is None
    short = _megatron([2.0] * 2 + [8.0])
    assert _finding(_diagnose(diagnoser, short), "loss-spike") is None
    val = [f"step {i}: train loss 2.0{i % 10}, val loss {2.0 if i < 20 else 9.0:.2f}" for i in range(40)]
    val += [f"Epoch 1 | Validation loss: {9.5:.2f}"] * 5
    assert _finding(_diagnose(diagnoser, val), "loss-spike") is None


def test_a_short_paste_of_a_loss_that_climbs_and_stays_is_a_divergence(diagnoser):
    """Four HF Trainer loss dicts, as an issue thread quotes them: the fourth is many times the first three."""
    lines = [f"{{'loss': {v}, 'learning_rate': 0.0002, 'epoch': {0.14 * (i + 1):.2f}}}"
             for i, v in enumerate([2.41, 3.02, 7.88, 41.5])]
    spike = _finding(_diagnose(diagnoser, lines), "loss-spike")
    assert spike is not None and spike.first.line == 4


def test_divergence_early_in_a_long_log_is_read_over_the_whole_run(diagnoser):
    """The turn is in the first megabyte, followed by 24 MB of progress: the old 128 KiB tail missed it."""
    head = _megatron([2.0] * 60 + [9.0] * 20)
    rest = _megatron([9.0 + (i % 7) * 0.1 for i in range(110_000)], start=810)
    d = _diagnose(diagnoser, head + rest)
    spike = _finding(d, "loss-spike")
    assert spike is not None and spike.first.line == 61


def test_nan_in_logged_grad_norms_that_stays_is_a_nan_loss(diagnoser):
    ok = [f"{{'loss': {2.0 - i / 100:.4f}, 'grad_norm': {0.5 + i / 100:.3f}, 'learning_rate': 1.9e-05, 'epoch': {i / 50:.2f}}}" for i in range(20)]
    bad = [f"{{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 1.9e-05, 'epoch': {0.4 + i / 50:.2f}}}" for i in range(6)]
    d = _diagnose(diagnoser, ok + bad)
    assert d.root.entry.id == "nan-loss"
    assert any("grad norm is NaN or Inf" in h.text and h.line == 21 for h in d.root.hits)


def test_a_few_infinite_grad_norms_while_fp16_calibrates_stay_silent(diagnoser):
    lines = [f"{{'loss': {2.0 - i / 100:.4f}, 'grad_norm': {'inf' if i in (0, 1, 3) else '0.51'}, 'learning_rate': 1e-05, 'epoch': {i / 50:.2f}}}"
             for i in range(30)]
    assert _diagnose(diagnoser, lines).findings == []


def test_fp16_scale_collapsing_to_its_floor_is_found(diagnoser):
    scale = lambda it: max(1.0, 65536.0 / 2 ** max(0, (it - 200) // 10))  # noqa: E731
    lines = _megatron([2.0] * 60, scale=scale, skipped=lambda it: 10 if it > 200 else 0)
    d = _diagnose(diagnoser, lines)
    assert d.root.entry.id == "fp16-loss-scale"
    assert any("to its floor 1" in h.text for h in d.root.hits)


def test_bf16_logs_a_scale_of_one_throughout_and_stays_silent(diagnoser):
    assert _diagnose(diagnoser, _megatron([2.0 - i / 1000 for i in range(60)], scale=1.0)).findings == []


def test_skipped_steps_for_a_large_share_of_iterations_after_calibration(diagnoser):
    lines = _megatron([2.0] * 60, skipped=lambda it: 4 if it > 100 else 0)
    fp16 = _finding(_diagnose(diagnoser, lines), "fp16-loss-scale")
    assert fp16 is not None and "40% of the iterations" in fp16.first.text


def test_deepspeed_calibration_skips_at_the_start_stay_silent(diagnoser):
    lines = [f"[2024-09-11 17:00:{i:02d},000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
             f"Attempted loss scale: {2 ** (32 - i)}, reducing to {2 ** (31 - i)}" for i in range(9)]
    lines += [f"[2024-09-11 17:{1 + i // 30:02d}:{2 * i % 60:02d},000] [INFO] [logging.py:96:log_dist] [Rank 0] step={10 * i}, skipped=9, "
              f"lr=[0.0003], mom=[(0.9, 0.95)]" for i in range(1, 60)]
    assert _finding(_diagnose(diagnoser, lines), "fp16-loss-scale") is None
    lines += [f"[2024-09-11 18:{i // 30:02d}:{2 * i % 60:02d},000] [INFO] [logging.py:96:log_dist] [Rank 0] step={600 + 10 * i}, "
              f"skipped={9 + 5 * i}, lr=[0.0003], mom=[(0.9, 0.95)]" for i in range(1, 60)]
    assert _finding(_diagnose(diagnoser, lines), "fp16-loss-scale") is not None


def test_a_stall_needs_timestamps_and_a_log_that_goes_on(diagnoser):
    steps = [f"[2024-09-11 17:00:{2 * i:02d},000] [INFO] [Rank 0] step={100 + i}, loss=1.9" for i in range(6)]
    later = ["[2024-09-11 17:30:00,000] [INFO] monitor: still waiting"]
    d = _diagnose(diagnoser, steps + later)
    assert d.root.entry.id == "training-hang"
    assert d.root.first.line == 6 and "no new progress line for 30 min" in d.root.first.text
    assert _diagnose(diagnoser, steps).findings == []  # the log ends with progress: nothing to judge
    assert _diagnose(diagnoser, steps + ["[2024-09-11 17:03:00,000] [INFO] saving checkpoint"]).findings == []


@pytest.mark.parametrize("step", ["Step {n}: loss: 1.9", "step {n}/5000 | loss: 1.9", "iter {n}: loss 1.9100, time 120.2ms"])
def test_a_stall_of_step_lines_without_an_equals_sign(diagnoser, step):
    """"Step 100: ...", "step 100/5000 | ..." and nanoGPT's "iter 100: ..." are progress lines too."""
    steps = [f"[2024-09-11 17:00:{2 * i:02d}] " + step.format(n=100 + i) for i in range(6)]
    d = _diagnose(diagnoser, steps + ["[2024-09-11 17:30:00] heartbeat: worker alive"])
    assert d.root.entry.id == "training-hang" and d.root.first.line == 6
    assert d.progress["iteration"] == 105


def test_untimed_progress_is_never_a_stall(diagnoser):
    lines = [f"[rank0]: iteration {i}/ 100 | lm loss: 2.0 |" for i in range(20)] + _noise(50)
    assert _diagnose(diagnoser, lines).findings == []


def test_an_explicit_failure_line_wins_over_a_judgement_from_numbers(diagnoser):
    lines = _megatron([2.0] * 40 + [9.0] * 10)
    assert _diagnose(diagnoser, lines).root.entry.id == "loss-spike"
    oom = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.15 GiB"
    assert _diagnose(diagnoser, lines + [oom]).root.entry.id == "cuda-oom"


def test_windows_read_a_bounded_share_of_a_long_file():
    series = trends.Series(engine=None)
    read = sum(end - start for pos in range(0, 2 << 30, 16 << 20) for start, end in series.windows(pos, 16 << 20))
    assert read < 2 << 20  # of 2 GB
    small = trends.Series(engine=None)
    assert small.windows(0, trends.FULL_BYTES) == [(0, trends.FULL_BYTES)]  # a short paste is read whole


def test_trends_of_several_files_are_judged_per_file(diagnoser):
    diverging = "\n".join(_megatron([2.0] * 40 + [9.0] * 10)) + "\n"
    healthy = "\n".join(_megatron([9.0] * 50)) + "\n"
    d = diagnose_streams(diagnoser, [("rank0.log", io.BytesIO(healthy.encode())), ("rank1.log", io.BytesIO(diverging.encode()))])
    spike = _finding(d, "loss-spike")
    assert spike is not None and {h.file for h in spike.hits} == {1}


def test_one_cumulative_deepspeed_count_is_enough_when_most_steps_were_skipped(diagnoser):
    def log_dist(step, skipped):
        return (f"[2021-11-26 03:07:16,494] [INFO] [logging.py:69:log_dist] [Rank 0] step={step}, skipped={skipped}, "
                "lr=[0.001, 0.001], mom=[0.0, 0.0]")

    noise = _noise(40)
    d = _diagnose(diagnoser, noise + [log_dist(2000, 1995)] + noise)
    assert _finding(d, "fp16-loss-scale") is not None
    # the calibration's skips (at most one an iteration at the start) are not a collapse
    assert _finding(_diagnose(diagnoser, noise + [log_dist(2000, 95)] + noise), "fp16-loss-scale") is None


def test_a_fairseq_scale_below_one_is_a_collapse_by_itself(diagnoser):
    lines = [f"2023-03-01 10:00:{i:02d} | INFO | train_inner | epoch 001:    {i * 100} / 5000 loss=7.1, "
             f"loss_scale={0.5 / 2 ** i:g}, wall={i * 60}" for i in range(8)]
    fp16 = _finding(_diagnose(diagnoser, lines), "fp16-loss-scale")
    assert fp16 is not None
    # a scale that stays at or above 1 with no fall is calibration, not a collapse
    healthy = [line.replace(f"loss_scale={0.5 / 2 ** i:g}", "loss_scale=128") for i, line in enumerate(lines)]
    assert _finding(_diagnose(diagnoser, healthy), "fp16-loss-scale") is None


def test_a_tensorflow_loss_equals_series_is_read_for_divergence(diagnoser):
    losses = [2.1 - i * 0.005 for i in range(40)] + [3.0, 4.4, 6.8, 7.9, 8.8, 9.4, 9.9, 10.3]
    lines = [f"INFO:tensorflow:loss = {loss:.4f}, step = {i * 100} ({0.41:.3f} sec)" for i, loss in enumerate(losses)]
    spike = _finding(_diagnose(diagnoser, lines), "loss-spike")
    assert spike is not None and "loss = 6.8000" in spike.first.text


def test_paddle_amp_halving_its_scale_far_below_one_is_a_collapse(diagnoser):
    lines = [f"[2022/11/08 14:54:{i:02d}] ppcls INFO: [Train][Epoch 2/800][Iter: {i}/366] loss: 12.44, batch_cost: 0.54s"
             for i in range(5)]
    lines += [f"Found inf or nan, current scale is: {2.0 ** -(10 + i)}, decrease to: {2.0 ** -(10 + i)}*0.5" for i in range(12)]
    d = _diagnose(diagnoser, lines)
    assert d.root.entry.id == "fp16-loss-scale"


def _mmengine(grad_norms):
    return [f"10/30 22:{18 + i // 2:02d}:{30 * (i % 2):02d} - mmengine - INFO - Epoch(train) [1][{10 * i}/735]  lr: 1.98e-04  "
            f"time: 2.89  loss: {2.7 - i / 100:.4f}  grad_norm: {g}" for i, g in enumerate(grad_norms)]


def test_mmengine_grad_norms_that_end_nan_are_a_nan_loss_one_inf_is_not(diagnoser):
    d = _diagnose(diagnoser, _mmengine(["3.06"] * 20 + ["nan", "nan"]))
    assert d.root.entry.id == "nan-loss" and d.root.first.line == 21
    assert _diagnose(diagnoser, _mmengine(["3.06"] * 20 + ["inf"])).findings == []
    assert _diagnose(diagnoser, _mmengine(["3.06"] * 20 + ["inf", "inf", "2.9"])).findings == []


def test_a_run_whose_last_logged_loss_is_infinite_ended_on_it(diagnoser):
    lines = [f"2017-08-20 16:11:{i:02d} INFO  DistriOptimizer$:295 - [Iteration {45400 + i}] Loss is {1.3 - i / 1000:.4f}. "
             f"Current learning rate is 0.0463." for i in range(30)]
    d = _diagnose(diagnoser, lines + ["2017-08-20 16:12:00 INFO  DistriOptimizer$:295 - [Iteration 45459] Loss is Infinity. "
                                      "Current learning rate is 0.0463."])
    assert d.root.entry.id == "nan-loss"
    assert _diagnose(diagnoser, lines[:15] + ["[Iteration 45415] Loss is Infinity."] + lines[15:]).findings == []


def test_a_divergence_in_pipe_separated_columns_is_found(diagnoser):
    lines = [f"step {10 * i:7d} | loss {2.0 - i / 1000:.4f} | lr 1.79e-04 | grad 0.075 | 113.4k tok/s" for i in range(40)]
    lines += [f"step {400 + 10 * i:7d} | loss {13.8 + i / 100:.4f} | lr 1.79e-04 | grad 0.768 | 37.5k tok/s" for i in range(30)]
    d = _diagnose(diagnoser, lines)
    assert d.root.entry.id == "loss-spike" and d.root.first.line == 41


def test_capitalised_train_loss_columns_are_read_and_test_loss_is_not(diagnoser):
    lines = [f"Epoch {i:3d} | Train Loss: {2.0 - i / 1000:.4f} | Test Loss: 2.10 | lr 1e-4" for i in range(40)]
    lines += [f"Epoch {40 + i:3d} | Train Loss: {13.8 + i / 100:.4f} | Test Loss: 2.10 | lr 1e-4" for i in range(20)]
    d = _diagnose(diagnoser, lines)
    assert d.root.entry.id == "loss-spike" and d.root.first.line == 41
    tested = [f"Epoch {i:3d} | Training loss: 2.00 | Test Loss: {2.0 if i < 40 else 14.0:.2f}" for i in range(60)]
    assert _finding(_diagnose(diagnoser, tested), "loss-spike") is None


def test_a_fairseq_scale_that_keeps_rising_back_from_half_is_no_collapse(diagnoser):
    lines = []
    for epoch, scale in enumerate([0.5, 1.0, 1.0, 0.5, 1.0, 0.5, 1.0, 0.5]):
        if scale == 0.5:
            lines.append("| WARNING: overflow detected, setting loss scale to: 0.5")
        lines.append(f"| epoch {51 + epoch:03d} | loss {3.62 - epoch / 200:.3f} | nll_loss 1.919 | ppl 3.78 | "
                     f"num_updates {12960 + 255 * epoch} | gnorm 0.279 | clip 0% | oom 0 | loss_scale {scale:.3f} | wall 19720")
    assert _finding(_diagnose(diagnoser, lines), "fp16-loss-scale") is None
    collapsed = lines + [f"| WARNING: overflow detected, setting loss scale to: {0.5 / 2 ** i:g}" for i in range(1, 6)]
    assert _diagnose(diagnoser, collapsed).root.entry.id == "fp16-loss-scale"


def test_one_reading_of_the_scale_at_its_floor_as_the_paste_ends_is_no_collapse(diagnoser):
    lines = []
    for epoch in range(6):
        lines.append(f"| epoch {22 + epoch:03d} | loss {3.88 - epoch / 50:.3f} | nll_loss 2.204 | num_updates {5586 + 254 * epoch} "
                     f"| gnorm 0.309 | clip 0% | oom 0 | loss_scale 1.000 | wall {8409 + 400 * epoch}")
        lines.append("| WARNING: overflow detected, setting loss scale to: 1.0")
    ending = lines + ["| WARNING: overflow detected, setting loss scale to: 0.5"]
    assert _finding(_diagnose(diagnoser, ending), "fp16-loss-scale") is None
    stays = ending + ["| WARNING: overflow detected, setting loss scale to: 0.25",
                      "| WARNING: overflow detected, setting loss scale to: 0.125"]
    assert _diagnose(diagnoser, stays).root.entry.id == "fp16-loss-scale"
    zero = lines + ["[INFO] [loss_scaler.py:181:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
                    "Attempted loss scale: 0, reducing to 0"]
    assert _finding(_diagnose(diagnoser, zero), "fp16-loss-scale") is not None  # no floor to wait at


def test_an_averaged_loss_in_a_progress_bar_postfix_is_read(diagnoser):
    # kohya's sd-scripts: "avr_loss=0.113"; a LoRA run whose average goes NaN and stays
    bars = [f"steps:  {i:2d}%|██        | {41 * i}/3280 [01:40<1:05:00,  1.22s/it, avr_loss={0.11 + i / 1000:.4f}]"
            for i in range(1, 30)]
    ends = bars + [f"steps:  {i}%|██        | {41 * i}/3280 [01:40<1:05:00,  1.22s/it, avr_loss=nan]" for i in range(30, 33)]
    d = _diagnose(diagnoser, ends)
    assert d.root.entry.id == "nan-loss"
    assert any(fp.detector == trends.NONFINITE for fp in d.scan.hits)  # the series, not only the NaN lines
    diverged = bars + [f"steps:  {i}%|██        | {41 * i}/3280 [01:40<1:05:00,  1.22s/it, avr_loss={0.9 + i / 100:.4f}]"
                       for i in range(30, 50)]
    assert _finding(_diagnose(diagnoser, diverged), "loss-spike") is not None


def test_a_nan_loss_the_logged_loss_comes_back_from_is_no_failure(diagnoser):
    # an RL learner logs loss=nan until its replay buffer holds a batch, then real losses
    warmup = [f"episode={i} step={40 * i} reward={100 + i:.1f} epsilon=0.9{i:02d} loss=nan" for i in range(1, 16)]
    trained = [f"episode={i} step={40 * i} reward={100 + i:.1f} epsilon=0.8{i:02d} loss={2.5 - i / 100:.4f}" for i in range(16, 60)]
    assert _diagnose(diagnoser, warmup + trained).findings == []
    # the same NaN lines at the end of a run that went NaN and stayed: the run diverged
    ends = trained + [f"episode={i} step={40 * i} reward=0.0 epsilon=0.700 loss=nan" for i in range(60, 64)]
    d = _diagnose(diagnoser, ends)
    assert d.root.entry.id == "nan-loss" and d.root.first.line == 45
    # a NaN in the middle, finite losses after it, then NaN again to the end: the last run of NaN counts
    relapse = warmup + trained + [f"episode={i} step={40 * i} reward=0.0 epsilon=0.700 loss=nan" for i in range(60, 64)]
    assert _diagnose(diagnoser, relapse).root.first.line == 60


def test_nnunet_train_loss_lines_are_read(diagnoser):
    # nnU-Net logs "<time>: train_loss -0.4123" once an epoch (its Dice+CE loss is negative)
    epochs = [f"2024-03-02 {10 + i // 60:02d}:{i % 60:02d}:40.902113: train_loss {-0.2 - i / 100:.4f}" for i in range(20)]
    ends = epochs + ["2024-03-02 11:00:40.902113: train_loss nan", "2024-03-02 11:00:40.933015: val_loss nan"]
    d = _diagnose(diagnoser, ends)
    assert d.root.entry.id == "nan-loss"
    assert any(fp.detector == trends.NONFINITE for fp in d.scan.hits)

"""Secrets that appear in logs are masked before anything is shown, posted or stored."""
import pytest

from bot.engine.redact import MASK, redact

SECRETS = [
    ("slack bot token xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "xoxb-123456789012"),
    ("app token xapp-1-A0123456789-1234567890123-abcdef0123456789", "xapp-1-A0123"),
    ("git clone https://ghp_abcdefghijklmnopqrstuvwxyz0123456789@github.com/x", "ghp_abcdef"),
    ("HF token hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345", "hf_AbCd"),
    ("AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    ("export WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567", "0123456789abcdef"),
    ("OPENAI key sk-proj-abcdefghijklmnopqrstuvwxyz", "sk-proj-abc"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N", "eyJhbGci"),
    ("mongodb://admin:s3cr3tPass@db.internal:27017/runs", "s3cr3tPass"),
    ("--password hunter2222 ignored but password=hunter2222", "password=hunter2222"),
    ("-----BEGIN RSA PRIVATE KEY----- MIIEowIBAAKCAQEA", "MIIEowIBAAKCAQEA"),
]


@pytest.mark.parametrize("line, secret", SECRETS)
def test_secret_is_masked(line, secret):
    out = redact(line)
    assert secret not in out
    assert MASK in out


@pytest.mark.parametrize(
    "line",
    [
        "max_num_batched_tokens=8192 max_tokens: 512",
        "tokenizer loaded from /models/llama",
        "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB",
        "loss 2.113 | grad_norm 0.41",
    ],
)
def test_ordinary_lines_are_left_alone(line):
    assert redact(line) == line

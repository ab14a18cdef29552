"""Loss spikes and stalls judged from progress lines (bot/engine/trends.py), with the thresholds it states."""
from bot.engine import trends


def _hf(losses):
    return [f"{{'loss': {v}, 'grad_norm': 0.41, 'learning_rate': 1.9e-05, 'epoch': 0.{i:02d}}}" for i, v in enumerate(losses)]


def test_a_spike_that_stays_is_found_with_its_numbers():
    lines = _hf([2.0] * 12 + [6.5, 6.9, 7.2])
    [trend] = trends.analyse(lines)
    assert trend.kind == trends.LOSS_SPIKE and trend.line == 12
    assert "median of 2 to 6.5" in trend.meaning


def test_a_spike_that_recovers_or_lacks_history_is_not():
    assert trends.analyse(_hf([2.0] * 12 + [7.0, 2.1, 2.0])) == []
    assert trends.analyse(_hf([2.0] * 5 + [7.0, 7.0, 7.0])) == []  # fewer than MIN_HISTORY values before it
    assert trends.analyse(_hf([2.0] * 12 + [5.9])) == []  # below 3x


def test_val_loss_and_loss_scale_are_not_training_loss():
    lines = [f"iteration {i}/ 100 | lm loss: 2.0 | loss scale: {65536 if i < 12 else 1.0} | val_loss=9.9" for i in range(15)]
    assert trends.analyse(lines) == []


def test_a_stall_needs_timestamps_and_a_log_that_goes_on():
    steps = [f"[2024-09-11 17:00:{2 * i:02d},000] [INFO] [Rank 0] step={100 + i}, loss=1.9" for i in range(6)]
    later = ["[2024-09-11 17:30:00,000] [INFO] monitor: still waiting"]
    [trend] = trends.analyse(steps + later)
    assert trend.kind == trends.PROGRESS_STALL and trend.line == 5 and trend.iteration == "105"
    assert "no new progress line for 30 min" in trend.meaning
    assert trends.analyse(steps) == []  # the log ends with progress: nothing to judge
    assert trends.analyse(steps + ["[2024-09-11 17:03:00,000] [INFO] saving checkpoint"]) == []  # under 5 min


def test_untimed_progress_is_never_a_stall():
    lines = [f"[rank0]: iteration {i}/ 100 | lm loss: 2.0 |" for i in range(20)] + ["some later line"] * 50
    assert trends.analyse(lines) == []

"""What the tests of BaechiSession (tests/test_session_*.py) share."""

__all__ = ["TASK", "fast"]

TASK = "/job:localhost/replica:0/task:0"


def fast(**kwargs):
    return dict(warmup_steps=0, profile_steps=1, **kwargs)

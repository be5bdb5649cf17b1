"""A seam for whyslow's own failure tests: named points in the runtime where
a test can make whyslow fail (raise, or kill the process), to check that
training goes on without it. The shipped runtime only calls :func:`point`,
which does nothing unless a test installed a hook with :func:`set_hook`
(``tests/python/faulty_train.py`` does, from the test's settings)."""

from __future__ import annotations

from typing import Callable, Optional

Hook = Callable[[str, int], None]
_hook: Optional[Hook] = None

# The points the runtime passes, in the order a window reaches them.
POINTS = ("store", "profiler_start", "sampler_start", "sampler_write", "after_summarize")


def set_hook(hook: Optional[Hook]) -> None:
    """Installs (or, with None, removes) the test hook."""
    global _hook
    _hook = hook


def point(where: str, rank: int) -> None:
    """A named failure point; a no-op outside whyslow's tests."""
    hook = _hook
    if hook is not None:
        hook(where, rank)

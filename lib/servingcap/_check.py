"""Input validation shared by every public function.

Each checker returns the cleaned value and raises a ``ValueError`` whose message names
the parameter and the value it was given, so a reader who passes a bad number sees
which one and why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from numbers import Integral, Real

import numpy as np
import pandas as pd


class UnstableQueueError(ValueError):
    """Raised when offered load meets or exceeds capacity (utilization rho >= 1).

    Such a queue has no steady state: its waiting time grows without bound, so any
    finite answer would be wrong. The message shows rho and the rates behind it.
    """


class NumericOverflowError(ValueError, OverflowError):
    """Raised when every input is a finite number but the answer is not.

    Floating point holds magnitudes up to about 1.8e308; past that an operation gives
    ``inf`` (and later NaN). Returning that would be silent garbage, so the computation
    stops and the message names the inputs whose size caused it. It is a ``ValueError``
    (bad input) and an ``OverflowError`` (what went wrong).
    """


MAX_TOKENS = 10**12
"""Largest token count accepted for one request (a trillion tokens, far past any
context window). Larger counts are data errors; they would also overflow the int64
token sums the simulators keep."""

MAX_SERVERS = 10**12
"""Largest number of servers the closed forms and simulators accept. Far past any fleet;
it bounds the cost of the Erlang B series for overloaded loss systems."""


class TooLargeError(ValueError, MemoryError):
    """Raised when valid-looking inputs ask for more memory than the machine has
    (e.g. ten trillion samples). A ``ValueError`` naming the inputs, not a traceback
    from deep inside numpy."""


def _shown(args: dict) -> str:
    parts = []
    for key, value in args.items():
        if isinstance(value, (bool, int, float, str, type(None), np.integer, np.floating)):
            parts.append(f"{key}={value!r}")
        elif hasattr(value, "__len__"):
            parts.append(f"{key}=<{len(value)} values>")
        else:
            parts.append(f"{key}=<{type(value).__name__}>")
    return ", ".join(parts) or "its inputs"


def label(name: str, value) -> str:
    """A column or key name: a non-empty string."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a column name (a non-empty string), got {value!r}")
    return value


_OVERFLOW_MESSAGES = ("cannot convert float NaN to integer", "Maximum allowed dimension",
                      "array is too big", "Maximum allowed size", "p <= 0, p > 1 or p contains NaN",
                      "lam value too large")


def guarded(func):
    """Decorate a public function whose answer must be finite.

    Every valid input gives exactly the undecorated result. When finite inputs make
    the arithmetic overflow -- a float result of ``inf`` or NaN, a numpy overflow or
    invalid-value warning, ``OverflowError`` from converting ``inf`` to an int -- the
    call raises :class:`NumericOverflowError` naming the function and its scalar
    inputs instead of returning garbage; a ``MemoryError`` becomes
    :class:`TooLargeError` the same way.
    """
    import functools
    import inspect
    import warnings

    signature = inspect.signature(func)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        def inputs():
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                return "its inputs"
            return _shown(bound.arguments)

        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("error", category=RuntimeWarning,
                                        message=r"(overflow|invalid value)")
                result = func(*args, **kwargs)
        except (OverflowError, FloatingPointError, RuntimeWarning) as exc:
            if isinstance(exc, ValueError):
                raise
            raise NumericOverflowError(
                f"{func.__name__}: the result overflows floating point for {inputs()} "
                f"({exc}); use smaller units or check the inputs") from exc
        except MemoryError as exc:
            if isinstance(exc, ValueError):
                raise
            raise TooLargeError(f"{func.__name__}: not enough memory for {inputs()} "
                                f"({exc})") from exc
        except ValueError as exc:
            # numpy/Python messages for sizes and values past what floats/arrays hold
            text = str(exc)
            if isinstance(exc, NumericOverflowError) or not any(
                    key in text for key in _OVERFLOW_MESSAGES):
                raise
            raise NumericOverflowError(
                f"{func.__name__}: the inputs are too large or too small ({inputs()}): "
                f"{text}") from exc
        values = result if isinstance(result, tuple) else (result,)
        if dataclasses.is_dataclass(result) and not isinstance(result, type):
            values = tuple(getattr(result, f.name) for f in dataclasses.fields(result))
        for value in values:
            if isinstance(value, (float, np.floating)) and not math.isfinite(value):
                raise NumericOverflowError(
                    f"{func.__name__}: the result is {float(value)!r} for {inputs()}; "
                    "the inputs are too large or too small for floating point")
            if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.size \
                    and not np.isfinite(value).all():
                raise NumericOverflowError(
                    f"{func.__name__}: the result holds non-finite values for {inputs()}; "
                    "the inputs are too large or too small for floating point")
        return result

    return wrapper


def mentions(message: str, name: str) -> bool:
    """Whether ``message`` names ``name`` as a word (``n`` is not in ``"mean"``)."""
    import re
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None


@contextlib.contextmanager
def naming(name: str, others=()):
    """Within the block, a ``ValueError`` or ``TypeError`` whose message mentions neither
    ``name`` nor any of ``others`` gets ``"name: "`` put in front (same exception type).
    For public functions that hand a parameter to a shared helper which knows it by
    another name."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        if any(mentions(str(exc), n) for n in (name, *others)):
            raise
        try:
            renamed = type(exc)(f"{name}: {exc}")
        except Exception:                                   # noqa: BLE001
            renamed = ValueError(f"{name}: {exc}")
        raise renamed from exc


def renames(name: str):
    """Decorator form of :func:`naming` for a whole public function."""
    import functools

    def decorate(func):
        import inspect
        others = [p for p in inspect.signature(func).parameters if p != name]

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with naming(name, others):
                return func(*args, **kwargs)
        return wrapper
    return decorate


@contextlib.contextmanager
def overflow(detail: str):
    """Within the block, ``OverflowError``/``FloatingPointError``/``ZeroDivisionError``
    from finite inputs become :class:`NumericOverflowError` naming ``detail`` (the
    parameters and their values), as do scipy root-finders that fail because of them."""
    try:
        yield
    except (OverflowError, FloatingPointError, ZeroDivisionError) as exc:
        raise NumericOverflowError(f"{detail}: out of floating-point range ({exc})") from exc
    except ValueError as exc:
        if "f(a) and f(b) must have different signs" not in str(exc):
            raise
        raise NumericOverflowError(f"{detail}: no solution found in floating point "
                                   f"({exc})") from exc


def finite_result(value: float, detail: str) -> float:
    """Return ``value`` if it is finite, else raise :class:`NumericOverflowError`.

    ``detail`` names the parameters and values whose size overflowed, e.g.
    ``"L=1e+308 / time_in_system=1e-308"``.
    """
    if not math.isfinite(value):
        raise NumericOverflowError(
            f"result overflows floating point ({detail} is beyond +-1.8e308); "
            "use smaller units or check the inputs"
        )
    return value


def number(name: str, value) -> float:
    """A finite real number (not bool, not NaN, not infinite)."""
    if isinstance(value, bool) or not isinstance(value, (Real, np.floating, np.integer)):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def positive(name: str, value) -> float:
    """A finite number > 0."""
    value = number(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def nonnegative(name: str, value) -> float:
    """A finite number >= 0."""
    value = number(name, value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def probability(name: str, value) -> float:
    """A probability strictly inside (0, 1), as quantile levels must be."""
    value = number(name, value)
    if not 0 < value < 1:
        raise ValueError(f"{name} must be strictly between 0 and 1, got {value!r}")
    return value


def whole(name: str, value, minimum: int = 1) -> int:
    """An integer >= ``minimum`` (floats equal to an integer are accepted)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    if isinstance(value, (Integral, np.integer)):
        out = int(value)
    elif isinstance(value, (Real, np.floating)) and math.isfinite(value) and float(value).is_integer():
        out = int(value)
    else:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    if out < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return out


def generator(name: str, seed) -> np.random.Generator:
    """``numpy.random.default_rng(seed)``: a ``Generator`` (returned as is), ``None``, a
    non-negative int, a sequence of them or a ``SeedSequence``; anything else raises a
    ``ValueError`` naming the parameter. Valid seeds give exactly numpy's stream."""
    if isinstance(seed, (bool, np.bool_, float, np.floating, str, bytes)):
        raise ValueError(f"{name} must be a seed (an int >= 0, a sequence of them) or a "
                         f"numpy Generator, got {seed!r}")
    try:
        return np.random.default_rng(seed)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a seed (an int >= 0, a sequence of them) or a "
                         f"numpy Generator, got {seed!r} ({exc})") from exc


MAX_SAMPLES = 10**9
"""Largest number of samples (requests, draws) one call may ask for: a billion float64
values already take 8 GB. Larger requests are refused up front instead of failing
inside numpy with a MemoryError."""


MAX_WINDOWS = 10**7
"""Largest number of counting windows one call may make (a year in 5 s windows is
6.3e6). More means a window far too short for the span (or a far-away ``start``)."""


def windows(span_s: float, window_s: float, detail: str) -> int:
    """Whole windows of ``window_s`` in ``span_s`` (s), refused past :data:`MAX_WINDOWS`."""
    count = span_s / window_s
    if not count <= MAX_WINDOWS:
        raise ValueError(f"{detail} make {count:.3g} windows, more than {MAX_WINDOWS:.0e}; "
                         "use a longer window_s")
    return int(math.floor(count))


def size(name: str, value, minimum: int = 1) -> int:
    """A sample count: a whole number from ``minimum`` to :data:`MAX_SAMPLES`."""
    n = whole(name, value, minimum=minimum)
    if n > MAX_SAMPLES:
        raise ValueError(f"{name} must be <= {MAX_SAMPLES:.0e} (samples held in memory), "
                         f"got {value!r}")
    return n


def stable(utilization: float, detail: str) -> float:
    """Return ``utilization`` if it is below 1, else raise :class:`UnstableQueueError`."""
    if utilization >= 1:
        raise UnstableQueueError(
            f"unstable queue: utilization rho = {utilization:.4g} >= 1 ({detail}); "
            "arrivals meet or exceed capacity, so the queue grows without bound and "
            "has no steady-state latency"
        )
    return utilization


def points(name: str, values) -> np.ndarray:
    """Real numbers of any shape (a scalar gives a 0-d array) at which a function such
    as a CDF is evaluated: ``-inf`` and ``+inf`` are allowed, NaN, ``None``, strings and
    booleans are not."""
    if isinstance(values, (bool, np.bool_, str, bytes)) or values is None:
        raise ValueError(f"{name} must be a number or an array of numbers, got {values!r}")
    try:
        out = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a number or an array of numbers, got {values!r}") from exc
    if np.asarray(values).dtype.kind not in "iuf":
        raise ValueError(f"{name} must be a number or an array of numbers, got {values!r}")
    if np.isnan(out).any():
        i = np.unravel_index(int(np.argmax(np.isnan(out))), out.shape) if out.ndim else ()
        where = f" at index {tuple(int(k) for k in i)}" if out.ndim else ""
        raise ValueError(f"{name} must not be NaN, got nan{where}")
    return out


def array(name: str, values, *, nonnegative_values: bool = False,
          allow_inf: bool = False) -> np.ndarray:
    """A 1-D float array of finite numbers (optionally all >= 0). With ``allow_inf``,
    +inf is allowed too (a failed request is infinitely late); NaN and -inf never are."""
    try:
        out = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a 1-D array of numbers, got {values!r}") from exc
    if out.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got an array of shape {out.shape}")
    bad = (np.isnan(out) | (out == -np.inf)) if allow_inf else ~np.isfinite(out)
    if bad.any():
        i = int(np.argmax(bad))
        need = "must not hold NaN or -inf" if allow_inf else "must be finite"
        raise ValueError(f"{name} {need}, got {out[i]!r} at index {i}")
    if nonnegative_values and (out < 0).any():
        i = int(np.argmax(out < 0))
        raise ValueError(f"{name} must be >= 0, got {out[i]!r} at index {i}")
    return out


def arrivals_and_services(arrival_times, service_times, names=("arrival_times", "service_times")
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Validated queue inputs: same-length 1-D arrays, arrivals non-decreasing (s),
    services >= 0 (s). ``names`` are the caller's parameter names, used in messages."""
    arrivals, services = names
    a = array(arrivals, arrival_times)
    s = array(services, service_times, nonnegative_values=True)
    if a.shape != s.shape:
        raise ValueError(
            f"{arrivals} and {services} must have the same length, got {a.size} and {s.size}"
        )
    if a.size > 1 and np.less(a[1:], a[:-1]).any():
        i = int(np.argmax(np.less(a[1:], a[:-1]))) + 1
        raise ValueError(
            f"{arrivals} must be non-decreasing, got {a[i]!r} after {a[i - 1]!r} at index {i}"
        )
    if a.size:
        # Every start, finish and wait of a FCFS queue lies within
        # [min(a), max(a) + sum(s)], so when twice that span is finite nothing overflows.
        with np.errstate(over="ignore"):      # arrivals are sorted: |a| peaks at an end
            reach, total = max(abs(float(a[0])), abs(float(a[-1]))), float(s.sum())
        finite_result(2 * (reach + total),
                      f"max |{arrivals}| + sum({services}) = {reach:.3g} + {total:.3g} s")
    return a, s


def column(frame, name: str, table: str = "requests") -> np.ndarray:
    """``frame[name]`` as a float array (NaN and inf kept: callers decide what they
    mean), or a ``ValueError`` naming the table parameter and the column when the
    table is not a DataFrame, lacks the column, or holds something other than numbers
    (strings, dates, objects) in it."""
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"{table} must be a pandas DataFrame, got {type(frame).__name__}")
    if name not in frame.columns:
        raise ValueError(f"{table} is missing column {name!r}; it has {list(frame.columns)}")
    values = frame[name]
    if pd.api.types.is_bool_dtype(values) or not (
            pd.api.types.is_numeric_dtype(values) or values.dtype == object):
        raise ValueError(f"{table} column {name!r} must hold numbers, got dtype {values.dtype}")
    try:
        return values.to_numpy(dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{table} column {name!r} must hold numbers ({exc})") from exc


def table(name: str, frame, columns=(), minimum: int = 0) -> pd.DataFrame:
    """A DataFrame parameter holding ``columns`` and at least ``minimum`` rows; the
    ``ValueError`` names the parameter (and the missing columns)."""
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"{name} must be a pandas DataFrame, got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name} is missing column(s) {missing}; it has {list(frame.columns)}")
    if len(frame) < minimum:
        raise ValueError(f"{name} must hold at least {minimum} rows, got {len(frame)}")
    return frame


REQUEST_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")


def request_tokens(frame, table: str = "requests") -> None:
    """The token columns of a request table that are present (``prompt_tokens``,
    ``output_tokens``) must hold whole numbers from 0 to :data:`MAX_TOKENS`."""
    for name in ("prompt_tokens", "output_tokens"):
        if name in frame.columns:
            values = array(f"{table}[{name!r}]", column(frame, name, table),
                           nonnegative_values=True)
            bad = (values != np.round(values)) | (values > MAX_TOKENS)
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError(f"{table}[{name!r}] must be whole numbers of tokens from 0 to "
                                 f"{MAX_TOKENS:.0e}, got {values[i]!r} at row {i}")


def requests(frame, minimum: int = 1) -> pd.DataFrame:
    """A request table: a DataFrame with ``arrival_s, prompt_tokens, output_tokens``
    (s, tokens, tokens), at least ``minimum`` rows and finite arrival times."""
    table("requests", frame, REQUEST_COLUMNS)
    if len(frame) < minimum:
        noun = "request" if minimum == 1 else "requests"
        raise ValueError(f"requests must hold at least {minimum} {noun}, got {len(frame)}")
    array("arrival_s", frame["arrival_s"])
    return frame

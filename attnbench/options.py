"""What a user can set, defined once for flags and sweep files (TOML): names, parsers, help.

Every value is text first (a flag, or a TOML value written back as text) and goes through the
same parser, so a bad value gets the same one-line message wherever it came from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from attnbench.case import DEVICES, LEVELS, MODES, PHASES, CaseError, canonical_dtype
from attnbench.errors import UsageError, did_you_mean
from attnbench.masks import ALIGNS, KINDS, MODS, canonical_mod
from attnbench.masks.blocks import parse_sparsity
from attnbench.masks.document import parse_docs
from attnbench.models import model as find_model
from attnbench.spec import PRESETS
from attnbench.store.schema import STATUSES


def _items(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if any(not item for item in items):
        raise ValueError("empty item in the comma-separated list")
    return items


def _positive(
    cast: type, noun: str, most: float = float("inf"), why: str = ""
) -> Callable[[str], int | float]:
    """A parser of positive finite numbers of type ``cast`` (int or float), at most ``most``
    (``why``: what a larger one would mean)."""

    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise ValueError(f"{text!r} is not {noun}") from None
        if not 0 < value < float("inf"):
            raise ValueError(f"{text} must be a positive {noun.split()[-1]}")
        if value > most:
            raise ValueError(f"{text} is more than {most:g} ({why})")
        return value

    return parse


REP_MS_MAX = 60_000.0  # --rep-ms: a minute of measuring per row is already far past stable
_positive_int = _positive(int, "an integer")
_positive_float = _positive(float, "a number")


def _choice(what: str, allowed) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            did = did_you_mean(text, allowed)
            raise ValueError(f"unknown {what} {text!r}{did} (allowed: {', '.join(allowed)})")
        return text

    return parse


def _list(cast: Callable[[str], Any]) -> Callable[[str], list]:
    return lambda text: list(dict.fromkeys(cast(item) for item in _items(text)))


def _mask(text: str) -> str:
    """A --mask value, KIND or KIND:SPEC; a built-in kind's spec in canonical form. A name
    that is not (yet) a kind is checked when the grid is built, after plugins register
    theirs."""
    name, sep, spec = text.partition(":")
    if name not in KINDS:
        return text
    if not sep:
        return name
    try:
        return f"{name}:{KINDS[name].canonical(spec)}"
    except ValueError as exc:
        raise ValueError(f"mask {name}: {exc}") from None


def _score_mod(text: str) -> str:
    """A --score-mod value in canonical form ('' for none); a plugin's is checked later."""
    name = text.partition(":")[0]
    return canonical_mod(text) if name in (*MODS, "none") else text


def _causal(text: str) -> list[bool]:
    table = {"true": [True], "false": [False], "both": [False, True]}
    out = []
    for item in _items(text.lower()):
        if item not in table:
            raise ValueError(f"{item!r} is not one of true, false, both")
        out.extend(table[item])
    return list(dict.fromkeys(out))


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError(f"{text!r} is not true or false")
    return text.lower() == "true"


def _profile(text: str) -> tuple[str, ...]:
    """() profiles every pair; otherwise the texts a pair's description must all contain."""
    return () if text.strip() == "all" else tuple(_items(text))


def _device(text: str) -> str:
    if text.split(":")[0] not in DEVICES:
        raise ValueError(f"unknown device {text!r} (allowed: {', '.join(DEVICES)})")
    return text


def _ray_address(text: str) -> str:
    """auto, ray://host:port, or host:port of a running cluster's head."""
    text = text.strip()
    if text == "auto":
        return text
    rest = text.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or " " in rest:
        raise ValueError("give auto, HOST:PORT or ray://HOST:PORT (e.g. 10.0.0.1:6379)")
    return text


def _model(text: str) -> str:
    try:
        return find_model(text).name
    except CaseError as exc:
        raise ValueError(str(exc)) from None


def _dtype(text: str) -> str:
    try:
        return canonical_dtype(text)
    except CaseError as exc:
        raise ValueError(str(exc)) from None


@dataclass(frozen=True)
class Option:
    """A sweep option: how its text is parsed, its help, how its flag is written (``style``:
    ``value`` --flag VALUE; ``toggle`` --flag and --no-flag, ``no_help`` the latter's help;
    ``const`` --flag alone; ``optional`` --flag [VALUE], alone meaning ``const``; ``append``
    --flag VALUE, repeatable) and what it sets (``scope``: ``grid`` the cases; ``measure`` how a
    row is measured: kept in env.json and given back by the reproducer; ``run`` the sweep
    itself; ``ray`` the Ray executor)."""

    parse: Callable[[str], Any]
    help: str
    style: str = "value"
    scope: str = "grid"
    no_help: str = ""
    const: str = "true"
    metavar: str | None = None


OPTIONS: dict[str, Option] = {
    "preset": Option(
        _choice("preset", PRESETS),
        f"base grid: {', '.join(PRESETS)} (default: gpu with "
        "CUDA, else cpu); the options below override its fields",
    ),
    "impls": Option(_list(str), "comma list of impl names (default: all)"),
    "model": Option(
        _list(_model),
        "model presets (--list-models): their heads, kv heads, head dim, causal, mask and "
        "lengths replace the preset's; flags still override them",
    ),
    "phase": Option(
        _list(_choice("phase", PHASES)),
        "prefill (fwd at the lengths), train (fwd_bwd), decode (1 and 4 new tokens against "
        "a KV cache of 1k-128k, batch 1-64, bottom-right causal); with or without --model",
    ),
    "batch": Option(_list(_positive_int), "batch sizes"),
    "heads": Option(_list(_positive_int), "query heads"),
    "kv_heads": Option(
        _list(_positive_int), "key/value heads (default: = heads; fewer is GQA/MQA)"
    ),
    "seq_len": Option(_list(_positive_int), "query lengths"),
    "seq_len_kv": Option(_list(_positive_int), "key/value lengths (default: = seq-len)"),
    "head_dim": Option(_list(_positive_int), "head dims"),
    "dtype": Option(_list(_dtype), "float32, bfloat16, float16 (fp32, bf16, fp16 accepted)"),
    "causal": Option(_causal, "true, false or both"),
    "mode": Option(_list(_choice("mode", MODES)), "fwd, bwd (backward alone), fwd_bwd"),
    "mask": Option(
        _list(_mask),
        "; ".join(f"{k.name}: {k.meaning}" for k in KINDS.values())
        + "; or a plugin's kind (default none). KIND:SPEC gives a kind's spec; causal means "
        "mask none with causal true, the others combine with every --causal value",
    ),
    "score_mod": Option(
        _list(_score_mod),
        "score modifiers applied before the mask, one per case: none (default), softcap:CAP "
        "(cap·tanh(s/cap); Gemma 2: 50), alibi (ALiBi slopes per head), or a plugin's",
    ),
    "docs": Option(
        _list(parse_docs),
        "mask document: the lengths of the documents packed into each sequence: fixed:LEN, "
        "uniform:MIN-MAX (drawn from the seed) or LEN+LEN+... (cycled); the last document "
        "is cut to fit (default uniform:64-512)",
    ),
    "sparsity": Option(
        _list(parse_sparsity),
        "masks block_sparse and strided, key=value pairs joined by ':': block_sparse "
        "block=64:local=3:global=1:random=2 (blocks of 64; a window of 3 blocks; 1 global "
        "block; 2 random blocks per query block), strided block=64:stride=4 (the defaults)",
    ),
    "window": Option(
        _list(_positive_int),
        "window widths W for mask window (the kind's spec, as --mask window:W): query i "
        "sees keys |i - j| < W, or i - W < j <= i when causal",
    ),
    "causal_align": Option(
        _list(_choice("causal_align", ALIGNS)),
        "top_left (query i sees keys j <= i, SDPA's is_causal; default) or bottom_right "
        "(j <= i + Skv - Sq, decoding with a KV cache); places causal and window masks",
    ),
    "level": Option(
        _list(_choice("level", LEVELS)),
        "op (attention alone, default) or layer (projections + attention + output projection)",
    ),
    "device": Option(_device, "cpu or cuda (default: cuda when available)"),
    "rep_ms": Option(
        _positive(float, "a number", REP_MS_MAX, "a minute of measuring per row"),
        "time spent measuring each row, ms (default 100; smoke preset 10)",
    ),
    "seed": Option(lambda t: int(t), "seed of the inputs (default 0)", scope="run"),
    "plugin": Option(
        _list(str),
        "a .py file, a folder of them (every *.py but _*.py) or a module registering impls "
        "(repeatable)",
        style="append",
        scope="run",
        metavar="PATH",
    ),
    "timeout": Option(
        _positive_float,
        "seconds one row may take before its worker is killed (status timeout; implies --isolate)",
        scope="measure",
    ),
    "isolate": Option(
        _bool,
        "run impls in a worker process, so crashes and hangs become rows (default: true)",
        style="toggle",
        scope="measure",
        no_help="run impls in this process",
    ),
    "malloc_tunables": Option(
        _bool,
        "CPU: keep glibc from handing the heap back to the OS between timed calls "
        "(GLIBC_TUNABLES in workers, mallopt in process; default: true)",
        style="toggle",
        scope="measure",
        no_help="leave glibc's allocator at its defaults (to measure their effect)",
    ),
    "cuda_graph": Option(
        _bool,
        "CUDA: time each row by replaying a CUDA graph of its timed call, without the host's "
        "launch cost (short kernels: decode); mode fwd only (default: false)",
        style="const",
        scope="run",  # each row records it (its cuda_graph column), and its reproducer from it
    ),
    "threads": Option(
        _positive_int,
        "CPU threads torch may use (default: torch's choice; with --executor ray on the CPU, "
        "each actor's CPUs, default 1)",
        scope="measure",
    ),
    "executor": Option(
        _choice("executor", ("local", "ray")),
        "local (this machine, default) or ray: one Ray actor per GPU (or per --threads CPUs) "
        "across a Ray cluster (docs/distributed.md)",
        scope="run",
    ),
    "ray_address": Option(
        _ray_address,
        "with --executor ray: the cluster to join: auto (the one running here), HOST:PORT, "
        "or ray://HOST:PORT (default: start a local Ray instance)",
        scope="ray",
    ),
    "ray_actors": Option(
        _positive_int,
        "with --executor ray: at most this many actors (default: one per device)",
        scope="ray",
    ),
    "group_by_device_name": Option(
        _bool,
        "keep each case family on one kind of device, also across --resume "
        "(default: true; --no-group-by-device-name lets any device continue it)",
        style="toggle",
        scope="run",
        no_help="let a device of any kind continue a family started on another",
    ),
    "retry": Option(
        _list(_choice("status", [s for s in STATUSES if s != "ok"])),
        "with --resume: also run again the rows of these statuses, comma-separated (e.g. "
        "crash,timeout); rows lost to the infrastructure (status lost) always are",
        scope="run",
    ),
    "profile": Option(
        _profile,
        "profile the (case, impl) pairs: 'all', or comma-separated "
        "texts that must all appear in '<impl> <case label>' (e.g. tiled,S2048); "
        "writes a Chrome trace per pair and a kernel table; on CUDA every row is then "
        "cross-checked against the profiler (without it: the first and every tenth per impl)",
        style="optional",
        scope="run",
        const="all",
        metavar="MATCH",
    ),
}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_value(name: str, text: str, where: str) -> Any:
    """Parse one option's text; ``where`` names its origin in the error (a flag or a file)."""
    try:
        return OPTIONS[name].parse(text)
    except ValueError as exc:
        raise UsageError(f"{where} {text!r}: {exc}") from None


def as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(as_text(v) for v in value)
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ValueError(f"{value!r} is not a number, string, boolean or list of them")


def load_config(path: Path) -> dict[str, Any]:
    """A sweep file: TOML with top-level keys named like the options (seq_len = [512, 1024])."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--config {path}: no such file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config {path}: not valid TOML ({exc})") from None
    out = {}
    for key, value in data.items():
        if key not in OPTIONS:
            raise UsageError(
                f"--config {path}: unknown field {key!r}{did_you_mean(key, OPTIONS)} "
                f"(allowed: {', '.join(OPTIONS)})"
            )
        try:
            text = as_text(value)
        except ValueError as exc:
            raise UsageError(f"--config {path}: {key}: {exc}") from None
        out[key] = parse_value(key, text, f"--config {path}: {key} =")
    return out


MEASURE_OPTIONS = tuple(n for n, o in OPTIONS.items() if o.scope == "measure")  # env.json

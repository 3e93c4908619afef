"""``model.backend: auto`` / ``model.dtype: auto``: which CPU path a run takes, decided from the CPU's flags.

:func:`choose_cpu_path` is pure (the CPU's facts in, the path and the reason out); :func:`read_cpu_facts` reads this
host's facts from ``/proc/cpuinfo``. The rule, from whole-process and forward-only measurements (BENCHMARKS.md,
"CPU paths"):

* native bfloat16 matrix units, i.e. AMX (``amx_bf16``): torch bfloat16 (an AMX Xeon's bfloat16 loop ran twice
  float32's; ONNX Runtime int8 ran slower than float32 there);
* AVX-512 BF16 on an AMD CPU (Zen 4 and later): torch bfloat16 (faster than float32 and than the int8 graph there);
* anything else, Intel AVX-512 BF16 without AMX included (bfloat16 measured slower than float32 there, and the
  int8 graph no faster): torch float32.

int8 is never the automatic choice: on every CPU measured where it beat float32, bfloat16 beat it by more, and it
fails the classifier tolerance where bfloat16 comes closer. A lossy choice is still checked against float32 on a
sample of the run's input before it scores, like any bfloat16 run.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CpuFacts", "CpuPath", "choose_cpu_path", "read_cpu_facts", "FLOAT32"]


@dataclass(frozen=True)
class CpuFacts:
    """What the choice reads of a CPU: its vendor (``GenuineIntel``, ``AuthenticAMD``, ...) and its flags."""

    vendor: str
    flags: frozenset[str]

    @property
    def name(self) -> str:
        """The vendor and the flags the rule reads, for the reason line."""
        shown = sorted(self.flags & {"amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx512f"})
        return f"{self.vendor or 'unknown vendor'} ({', '.join(shown) or 'no avx512 / amx flags'})"


@dataclass(frozen=True)
class CpuPath:
    """A concrete CPU path: ``backend``, ``dtype`` and ``quantize`` as the ``model`` section takes them, and why."""

    backend: str
    dtype: str
    quantize: str
    reason: str

    def as_report(self) -> dict[str, str]:
        """The path as a run report records it."""
        return {"backend": self.backend, "dtype": self.dtype, "quantize": self.quantize, "reason": self.reason}


FLOAT32 = ("torch", "float32", "none")


def choose_cpu_path(facts: CpuFacts, backend: str = "auto", lossy_allowed: bool = True) -> CpuPath:
    """The fastest CPU path for ``facts`` (module rule) on ``backend`` (``auto``: any; ``torch`` / ``onnx``: that one,
    whose fastest path here is then its float32 unless the rule picks a path on it). ``lossy_allowed``: whether the
    task has a tolerance check (text tasks); without one only float32 is offered."""
    if not lossy_allowed:
        return CpuPath(*_on(backend, FLOAT32), "float32: reduced precision is checked for text tasks only")
    if "amx_bf16" in facts.flags:
        choice, why = ("torch", "bfloat16", "none"), "AMX bfloat16 tiles: bfloat16 runs about twice float32"
    elif "avx512_bf16" in facts.flags and facts.vendor == "AuthenticAMD":
        choice, why = ("torch", "bfloat16", "none"), "AVX-512 BF16 on AMD: bfloat16 outruns float32 and int8"
    elif "avx512_bf16" in facts.flags:
        choice, why = FLOAT32, "AVX-512 BF16 without AMX: bfloat16 measured slower than float32"
    else:
        choice, why = FLOAT32, "no native bfloat16: float32 (int8 measured no faster without bfloat16 units)"
    if backend not in ("auto", choice[0]):
        return CpuPath(*_on(backend, FLOAT32), f"float32 on backend {backend} ({why} on torch)")
    return CpuPath(*choice, f"{facts.name}: {why}")


def _on(backend: str, path: tuple[str, str, str]) -> tuple[str, str, str]:
    return ("torch" if backend == "auto" else backend, *path[1:])


def read_cpu_facts(cpuinfo: str = "/proc/cpuinfo") -> CpuFacts:
    """This host's CPU facts from ``cpuinfo`` (the first processor's ``vendor_id`` and ``flags``); empty where the
    file is unreadable (not Linux), which the rule reads as a CPU without native bfloat16."""
    vendor, flags = "", frozenset[str]()
    try:
        with open(cpuinfo, encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key == "flags" and not flags:
                    flags = frozenset(value.split())
                if vendor and flags:
                    break
    except OSError:
        pass
    return CpuFacts(vendor, flags)

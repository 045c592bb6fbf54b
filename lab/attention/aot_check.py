"""Compile every configuration of kernelnotes.attention.hopper for sm_90 without a GPU.

    PYTHONPATH=src:. python lab/attention/aot_check.py [--json] [--persistent | --bwd]

For each of ``CONFIGS`` x D in (64, 128) x causal in (False, True), bfloat16, it builds the cubin
for ``GPUTarget("cuda", 90, 32)`` and prints whether it compiled, the shared memory the kernel
allocates, the ``setmaxnreg`` values in the PTX, and what ptxas -v (Triton's bundled ptxas) says
of registers and spills. A configuration whose tiles do not fit a block's shared memory at a head
dim is reported as such without compiling. Written for Triton 3.6; nothing here needs a GPU.
With ``--persistent`` it does the same for the persistent design C (lab/attention/fa3_persistent.py,
its own ``CONFIGS``) instead; with ``--bwd`` the Hopper backward, design D
(lab/attention/bwd_gluon.py, its ``CONFIGS`` per head dim, causal and not).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402
from triton.runtime.jit import mangle_type  # noqa: E402

from kernelnotes.attention import hopper as fa3  # noqa: E402
from lab.attention import bwd_gluon  # noqa: E402
from lab.attention import fa3_persistent as fa3p  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
N_PROBE = 4096  # the sequence length of the fake descriptors (its value is not compiled in)


def _desc_type(rows: int, head_dim: int) -> str:
    """The signature string of a bf16 [rows, head_dim] TMA descriptor, as the JIT mangles it."""
    base = torch.empty(N_PROBE, head_dim, dtype=torch.bfloat16)  # CPU: only its type is read
    layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], gl.bfloat16)
    return mangle_type(TensorDescriptor.from_tensor(base, [rows, head_dim], layout))


def _ptxas_info(ptx: str) -> dict:
    """Registers and spills of the kernel, from ptxas -v on the PTX Triton generated. Triton
    bundles two ptxas; the first that accepts the PTX's .version answers (3.9's PTX needs the
    newer one)."""
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    text = ""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        for tool in ("ptxas", "ptxas-blackwell"):
            if not (bin_dir / tool).exists():
                continue
            proc = subprocess.run([str(bin_dir / tool), "-arch=sm_90a", "-v", str(src), "-o",
                                   str(Path(tmp) / "k.cubin")], capture_output=True, text=True)
            text = proc.stdout + proc.stderr
            if proc.returncode == 0:
                break
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    stack = re.search(r"(\d+) bytes stack frame", text)
    return dict(ptxas_regs=int(regs.group(1)) if regs else None,
                spill_stores=int(spill.group(1)) if spill else None,
                spill_loads=int(spill.group(2)) if spill else None,
                stack=int(stack.group(1)) if stack else None)


def _innermost(exc: BaseException) -> str:
    """The root cause of a compilation error (Gluon wraps it once per call level)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    return f"{type(exc).__name__}: {str(exc)[-1500:]}"


def _compiled_row(row: dict, kernel, sig: dict, cx: dict, num_warps: int) -> dict:
    """Compile one kernel for sm_90 and add to row what came out: ok, shared bytes, warps, the
    setmaxnreg values and ptxas's registers and spills (or the error)."""
    try:
        ck = triton.compile(GluonASTSource(fn=kernel, signature=sig, constexprs=cx),
                            target=TARGET, options=dict(num_warps=num_warps))
    except Exception as exc:  # report and go on: the point is the table
        return row | dict(ok=False, error=_innermost(exc))
    ptx = ck.asm["ptx"]
    maxnreg = sorted({int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)",
                                                 ptx)})
    return row | dict(ok=True, shared=ck.metadata.shared, warps=ck.metadata.num_warps,
                      setmaxnreg=maxnreg, **_ptxas_info(ptx))


def compile_one(cfg: fa3.Config, head_dim: int, causal: bool) -> dict:
    """Compile _fa3_fwd_kernel for one configuration; a dict of what came out."""
    row = dict(config=cfg._asdict(), head_dim=head_dim, causal=causal)
    if cfg.shared_bytes(head_dim) > fa3.MAX_SHARED_BYTES:
        return row | dict(ok=False, error=f"tiles need {cfg.shared_bytes(head_dim)} B of shared "
                                          f"memory, over {fa3.MAX_SHARED_BYTES}")
    cx = dict(CAUSAL=causal, STAGES=cfg.stages, OVERLAP=cfg.overlap)
    sig = dict(q_desc=_desc_type(cfg.block_m, head_dim), k_desc=_desc_type(cfg.block_n, head_dim),
               v_desc=_desc_type(cfg.block_n, head_dim), o_ptr="*bf16", lse_ptr="*fp32",
               N="i32", GROUP="i32", qk_scale="fp32", LPT_HEADS="i32",
               **{k: "constexpr" for k in cx})
    return _compiled_row(row, fa3._fa3_fwd_kernel, sig, cx, fa3.CONSUMER_WARPS.value)


def compile_persistent(cfg: fa3p.Config, head_dim: int, causal: bool) -> dict:
    """Compile fa3_persistent's _fa3_persistent_kernel for one configuration, as compile_one."""
    row = dict(config=cfg._asdict(), head_dim=head_dim, causal=causal, design="persistent")
    need = cfg.shared_bytes(head_dim)
    if need > fa3.MAX_SHARED_BYTES:
        return row | dict(ok=False, error=f"tiles need {need} B of shared memory, over "
                                          f"{fa3.MAX_SHARED_BYTES}")
    cx = dict(CAUSAL=causal, STAGES=cfg.stages, OVERLAP=cfg.overlap)
    sig = dict(q_desc=_desc_type(cfg.block_m, head_dim), k_desc=_desc_type(cfg.block_n, head_dim),
               v_desc=_desc_type(cfg.block_n, head_dim), o_ptr="*bf16", lse_ptr="*fp32",
               N="i32", n_bh="i32", GROUP="i32", qk_scale="fp32", LPT_HEADS="i32",
               **{k: "constexpr" for k in cx})
    return _compiled_row(row, fa3p._fa3_persistent_kernel, sig, cx, fa3p.CONSUMER_WARPS.value)


def check_persistent() -> list[dict]:
    return [compile_persistent(cfg, d, causal)
            for cfg in fa3p.CONFIGS for d in fa3.HEAD_DIMS for causal in (False, True)]


def compile_bwd(head_dim: int, causal: bool) -> dict:
    """Compile bwd_gluon's _flash_bwd_hopper_kernel at one head dim (its CONFIGS[head_dim])."""
    cfg = bwd_gluon.CONFIGS[head_dim]
    row = dict(config=cfg._asdict(), head_dim=head_dim, causal=causal, design="bwd")
    need = cfg.shared_bytes(head_dim)
    if need > fa3.MAX_SHARED_BYTES:
        return row | dict(ok=False, error=f"tiles need {need} B of shared memory, over "
                                          f"{fa3.MAX_SHARED_BYTES}")
    cx = dict(CAUSAL=causal, STAGES=cfg.stages)
    kw = bwd_gluon.KEYS_PER_WG.value
    sig = dict(q_desc=_desc_type(cfg.block_m, head_dim), do_desc=_desc_type(cfg.block_m, head_dim),
               k_desc=_desc_type(kw, head_dim), v_desc=_desc_type(kw, head_dim),
               dq_ptr="*fp32", dk_ptr="*bf16", dv_ptr="*bf16", lse_ptr="*fp32",
               delta_ptr="*fp32", N="i32", sm_scale="fp32", qk_scale="fp32",
               **{k: "constexpr" for k in cx})
    return _compiled_row(row, bwd_gluon._flash_bwd_hopper_kernel, sig, cx,
                         bwd_gluon.CONSUMER_WARPS.value)


def check_bwd() -> list[dict]:
    return [compile_bwd(d, causal) for d in bwd_gluon.HEAD_DIMS for causal in (False, True)]


def _clean(row: dict) -> bool:
    """Compiled, and ptxas reported no spill stores or loads."""
    return row["ok"] and row["spill_stores"] == 0 and row["spill_loads"] == 0


def check_all() -> list[dict]:
    return [compile_one(cfg, d, causal)
            for cfg in fa3.CONFIGS for d in fa3.HEAD_DIMS for causal in (False, True)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON list at the end")
    parser.add_argument("--persistent", action="store_true",
                        help="compile the persistent design C (fa3_persistent.py) instead")
    parser.add_argument("--bwd", action="store_true",
                        help="compile the Hopper backward, design D (bwd_gluon.py), instead")
    args = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # 3.9 warns without it; 3.6's default
    print(f"triton {triton.__version__}, target sm_90"
          + (", design C (fa3_persistent)" if args.persistent else "")
          + (", design D (bwd_gluon)" if args.bwd else ""))
    if args.bwd:
        rows = check_bwd()
    else:
        rows = check_persistent() if args.persistent else check_all()
    for r in rows:
        c = r["config"]
        if r.get("design") == "bwd":
            name = (f"bwd block_m={c['block_m']:3d} stages={c['stages']} D={r['head_dim']:3d} "
                    f"causal={int(r['causal'])}")
        else:
            name = (f"block_m={c['block_m']:3d} block_n={c['block_n']:3d} stages={c['stages']} "
                    f"overlap={int(c['overlap'])} D={r['head_dim']:3d} causal={int(r['causal'])}")
        if r["ok"]:
            clean = _clean(r)
            print(f"{name}: OK   shared={r['shared']:6d} B  setmaxnreg={r['setmaxnreg']}  "
                  f"ptxas regs={r['ptxas_regs']} spills={r['spill_stores']}/{r['spill_loads']} B"
                  f" stack={r['stack']}{'' if clean else '  <-- SPILLS'}")
        else:
            print(f"{name}: FAIL {r['error']}")
    if args.json:
        print(json.dumps(rows))
    return 0 if all(r["ok"] and _clean(r) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

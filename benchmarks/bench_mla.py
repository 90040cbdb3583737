"""MLA decode and head-dim-512 prefill benchmark (a script, not a test), at an SM120's CTAs per SM.

MLA decode (``qv``: 64-wide rope q / k, 512-wide latent v, one KV head, every query head packed): graph replays of the
bundle over a dense and a page-64 latent cache, in bytes of latent + rope cache read per second and as a fraction of
the device's copy bandwidth (``bench_serving.copy_gbps``, same run). Peers: FlashInfer's MLA decode
(``BatchMLAPagedAttentionWrapper`` on its fa2 backend, the one that runs on SM120; staged by
``probes/stage_flashinfer.sh``) over the same page-64 caches, its output checked against ours; and the same attention
as 576 / 512-wide GQA through SDPA (its K the concatenated [v | k], built outside the timing, as a cache an engine would keep), with
whichever of its backends runs, pinned to the SM120's occupancy through the cache preference its eager run chose
(``bench_fwd.timed``), then replayed from a graph like ours.

Head dim 512 prefill (q, k, v 512 wide, MHA): eager, the bundle against SDPA's memory-efficient and math backends at
the SM120's occupancy, in TFLOPS (causal: half the square).

    python benchmarks/bench_mla.py --out results.json [--cases SUBSTR ...]

Tile sweep (``--tile``): ours only, with the table's ``--entries`` (default ``d512_latent``) replaced by each given
tile (FwdConfig knobs over each entry, e.g. ``tile_m=32,tile_n=16,dv_warps=2,num_stages=3``; each in a fresh process,
the table's own tiles first): the MLA decode rows at each ``--splits`` count (0: automatic) for latent entries, else
the prefill rows, into the result's ``tile_sweep``.

    python benchmarks/bench_mla.py --tile tile_m=32,tile_n=16,dv_warps=2 --splits 0 16 --cases h128 --out sweep.json
    python benchmarks/bench_mla.py --entries d512_causal d512_full --tile tile_m=32,tile_n=16,dv_warps=2 --out p.json
"""

import argparse
import dataclasses
import datetime
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fwd import OCCUPANCY_METHOD, sdpa, timed  # noqa: E402
from bench_serving import copy_gbps, flashinfer_and_workspace, paged, time_impl  # noqa: E402

import torch  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

import flash_attn_4_sm120 as fa  # noqa: E402

#: (name, batch, cached keys, query heads, query rows per step)
DECODE_CASES = [
    ("mla 16x4096 h16", 16, 4096, 16, 1),
    ("mla 64x4096 h16", 64, 4096, 16, 1),
    ("mla 16x32768 h16", 16, 32768, 16, 1),
    ("mla 16x4096 h128", 16, 4096, 128, 1),
    ("mla 64x8192 h128", 64, 8192, 128, 1),
    ("mla spec 16x(4,8192) h16", 16, 8192, 16, 4),
]
#: (name, batch, seqlen, heads, head dim, causal)
PREFILL_CASES = [("d512 2x4096 16/16 causal", 2, 4096, 16, 512, True), ("d512 2x4096 16/16 full", 2, 4096, 16, 512, False)]
SDPA_PEERS = {"sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa_math": SDPBackend.MATH}
PEERS = ("flashinfer_mla", *SDPA_PEERS)


def flashinfer_mla():
    """FlashInfer's MLA decode over paged latent / rope caches: ``make(q, qv, k_cache, v_cache, table, used, causal)``
    plans a ``BatchMLAPagedAttentionWrapper`` (fa2 backend) and returns the call; None when FlashInfer is absent."""
    staged = flashinfer_and_workspace()
    if staged is None:
        return None
    flashinfer, workspace = staged

    def make(q, qv, kc, vc, table, used, causal):
        b, sq, hq, rope = q.shape
        latent = qv.shape[-1]
        indptr = torch.arange(b + 1, dtype=torch.int32, device="cuda")
        w = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend="fa2")
        w.plan(indptr * sq, indptr * table.shape[1], table.flatten().contiguous(), used, hq, latent, rope,
               kc.shape[1], causal, (rope + latent) ** -0.5, q.dtype, kc.dtype)
        q_nope, q_pe = qv.reshape(b * sq, hq, latent), q.reshape(b * sq, hq, rope)
        ckv, kpe = vc.squeeze(2), kc.squeeze(2)  # one KV head: (pages, page_size, columns)
        return lambda: w.run(q_nope, q_pe, ckv, kpe)

    return make


def decode_rows(cases, model, copy, peers=True, num_splits=None, warm=False):
    """Rows of the decode cases: ours dense and paged (``num_splits``: None automatic), and FlashInfer and SDPA when
    ``peers``; ``warm``: each call run once, untimed (its kernels compiled into the disk cache)."""
    rows = []
    fi = flashinfer_mla() if peers else None
    for name, b, sk, hq, sq in DECODE_CASES:
        if cases and not any(c in name for c in cases):
            continue
        torch.manual_seed(0)
        q = torch.randn(b, sq, hq, 64, dtype=torch.bfloat16, device="cuda")
        qv = torch.randn(b, sq, hq, 512, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(b, sk, 1, 64, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(b, sk, 1, 512, dtype=torch.bfloat16, device="cuda")
        kc, vc, table = paged(k, v, 64)
        used = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        causal = sq > 1
        calls = {
            "ours dense": lambda: fa.flash_attn_func(q, k, v, qv=qv, causal=causal, num_splits=num_splits),
            "ours paged64": lambda: fa.flash_attn_varlen_func(q, kc, vc, qv=qv, seqused_k=used, page_table=table,
                                                              causal=causal, num_splits=num_splits),
        }
        q576, k576 = torch.cat([qv, q], -1), torch.cat([v, k], -1)
        row = {"case": name, "batch": b, "seqlen_k": sk, "heads_q": hq, "seqlen_q": sq, "results": {}, "emulation": {}}
        if fi is not None:
            try:
                calls["flashinfer_mla"] = fi(q, qv, kc, vc, table, used, causal)
                theirs, ours = (r[0] if isinstance(r, tuple) else r
                                for r in (calls["flashinfer_mla"](), calls["ours paged64"]()))
                row["flashinfer_max_diff"] = (theirs.view(b, sq, hq, 512).float() - ours.float()).abs().max().item()
            except Exception as e:  # noqa: BLE001  (reported, not fatal)
                row["results"]["flashinfer_mla"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                calls.pop("flashinfer_mla", None)
        for peer, backend in SDPA_PEERS.items() if peers else ():
            calls[peer] = lambda run=sdpa(backend): run(q576, k576, v, causal, None)
        cache_bytes = b * sk * (512 + 64) * 2
        for label, call in calls.items():
            if warm:
                call()
                continue
            try:
                if label.startswith("ours"):
                    r = time_impl("ours", call, "graph", model, row["emulation"])
                else:  # its eager run picks the cache preference the graph is captured under
                    r = timed(label, call, "sm120", model, row["emulation"], peers=PEERS)
                    if "ms" in r:
                        r = time_impl(label, call, "graph", model, row["emulation"])
            except Exception as e:
                r = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            if "ms" in r:
                r.update(cache_gbps=cache_bytes / r["ms"] / 1e6)
                r["copy_fraction"] = r["cache_gbps"] / copy
            row["results"][label] = r
        res = row["results"]
        best_peer = min((r["ms"] for k_, r in res.items() if k_.startswith("sdpa") and "ms" in r), default=None)
        if best_peer is not None and "ms" in res.get("ours paged64", {}):
            row["ours_paged_over_best_sdpa"] = best_peer / res["ours paged64"]["ms"]
        if "ms" in res.get("flashinfer_mla", {}) and "ms" in res.get("ours paged64", {}):
            row["ours_paged_over_flashinfer"] = res["flashinfer_mla"]["ms"] / res["ours paged64"]["ms"]
        print(f"{name}: " + " ".join(f"{k_}={r['ms'] * 1e3:.1f}us({r['copy_fraction']:.2f})" if "ms" in r else
                                     f"{k_}=-" for k_, r in res.items()), flush=True)
        rows.append(row)
    return rows


def prefill_rows(cases, model, peers=True, warm=False):
    """Rows of the prefill cases: ours, and SDPA when ``peers``; ``warm``: each call once, untimed."""
    rows = []
    for name, b, s, h, d, causal in PREFILL_CASES:
        if cases and not any(c in name for c in cases):
            continue
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        flops = 4 * b * h * s * s * d // (2 if causal else 1)
        calls = {"ours": lambda: fa.flash_attn_func(q, k, v, causal=causal)}
        for peer, backend in SDPA_PEERS.items() if peers else ():
            calls[peer] = lambda run=sdpa(backend): run(q, k, v, causal, None)
        row = {"case": name, "results": {}, "emulation": {}}
        for label, call in calls.items():
            if warm:
                call()
                continue
            try:
                r = timed(label, call, "sm120", model, row["emulation"], peers=tuple(SDPA_PEERS))
            except Exception as e:
                r = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            if "ms" in r:
                r["tflops"] = flops / r["ms"] / 1e9
            row["results"][label] = r
        res = row["results"]
        best_peer = min((r["ms"] for k_, r in res.items() if k_.startswith("sdpa") and "ms" in r), default=None)
        if best_peer is not None and "ms" in res.get("ours", {}):
            row["ours_over_best_sdpa"] = best_peer / res["ours"]["ms"]
        print(f"{name}: " + " ".join(f"{k_}={r['tflops']:.0f}TF" if "ms" in r else f"{k_}=-" for k_, r in res.items()),
              flush=True)
        rows.append(row)
    return rows


def tile_rows(entries: list, knobs: str, splits: list, cases, model, copy, warm=False) -> list:
    """Rows (ours only) with the table's ``entries`` replaced by ``knobs`` (in this process, before any call plans;
    "" keeps the table's tiles): MLA decode rows once per split count for latent entries, else the prefill rows."""
    from flash_attn_4_sm120 import config

    table = config.fwd_table()
    pairs = {k: int(v) for k, v in (kv.split("=") for kv in knobs.split(",") if kv)}
    for entry in entries:
        table[entry] = dataclasses.replace(table[entry], **pairs)
    tile = dataclasses.asdict(table[entries[0]])
    if not any("latent" in e for e in entries):
        return [{"tile": tile, **row} for row in prefill_rows(cases, model, peers=False, warm=warm)]
    return [{"tile": tile, "splits": s or "auto", **row}
            for s in splits for row in decode_rows(cases, model, copy, peers=False, num_splits=s or None, warm=warm)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--cases", nargs="*", help="only the cases whose names contain one of these strings")
    ap.add_argument("--tile", action="append", default=[], metavar="KNOB=VALUE,...",
                    help="sweep the decode rows over these d512_latent tiles (the table's first)")
    ap.add_argument("--splits", type=int, nargs="+", default=[0], help="split counts of the tile sweep (0: automatic)")
    ap.add_argument("--entries", nargs="+", default=["d512_latent"], help="the table entries the tile sweep replaces")
    ap.add_argument("--one-tile", help=argparse.SUPPRESS)
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    model = fa.dispatch_model(torch.device("cuda"))
    copy = copy_gbps()
    if args.one_tile is not None:
        rows = tile_rows(args.entries, args.one_tile, args.splits, args.cases, model, copy, args.warm)
        print("ROWS " + json.dumps([] if args.warm else rows))
        return
    print(f"device copy bandwidth {copy:.0f} GB/s", flush=True)
    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "torch": torch.__version__, "bundle_version": fa.__version__, "copy_gbps": copy,
              "method": OCCUPANCY_METHOD + "; MLA decode: every call replayed from a CUDA graph"}
    if args.tile:
        result["tile_sweep"] = []
        cmds = [[sys.executable, __file__, "--one-tile", knobs, "--splits", *map(str, args.splits),
                 "--entries", *args.entries, *(["--cases", *args.cases] if args.cases else [])]
                for knobs in ["", *args.tile]]
        for warming in [subprocess.Popen(cmd + ["--warm"]) for cmd in cmds]:  # compile every tile's kernels at once
            warming.wait()
        for cmd in cmds:
            out = subprocess.run(cmd, capture_output=True, text=True)
            print(out.stdout[-4000:], out.stderr[-2000:], flush=True)
            result["tile_sweep"] += [r for line in out.stdout.splitlines() if line.startswith("ROWS ")
                                     for r in json.loads(line[5:])]
    else:
        result.update(decode=decode_rows(args.cases, model, copy), prefill=prefill_rows(args.cases, model))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""Does the backward's key-major grid starve at training shapes with few KV heads? (a script, not a test)

The backward runs one CTA per (key block, KV head, batch) and walks the query heads of its group inside it,
so 8/2 heads at 8x512 is 8 x 2 x 8 = 128 CTAs. This times ``bench_bwd``'s implementations on training-sized
GQA shapes and on the same shapes with every query head its own KV head (MHA: 4x the CTAs, the same FLOPs),
at both occupancies; a large MHA/GQA gap for ours and not for FA2 says the grid is the limit.

    cd benchmarks && python3 explore/gqa_grid.py --out $OUT/gqa_grid.json
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_bwd  # noqa: E402

SHAPES = [(8, 512, 8, 2, 128), (4, 2048, 8, 2, 128), (4, 1024, 32, 8, 128), (8, 1024, 16, 4, 64)]
bench_bwd.CASES = [(f"d{d}_{b}x{s}_{hq}/{hkv}_causal", b, s, s, hq, hkv, d, d, True) for b, s, hq, hkv, d in SHAPES]
bench_bwd.CASES += [(f"d{d}_{b}x{s}_{hq}/{hq}_causal", b, s, s, hq, hq, d, d, True) for b, s, hq, hkv, d in SHAPES]

if __name__ == "__main__":
    bench_bwd.main()

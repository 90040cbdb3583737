import sys, time, torch
sys.path.insert(0, "torch-ext")
import flash_attn_4_sm120 as fa
def ms(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    s=torch.cuda.Event(enable_timing=True); e=torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): fn()
    e.record(); e.synchronize(); return s.elapsed_time(e)/n
for b,s,hq,hkv,causal in [(2,1000,16,4,True),(2,1024,16,4,True),(16,1024,32,8,True),(2,1000,16,4,False),(2,1024,16,4,False),(8,1000,16,4,True)]:
    q=torch.randn(b,s,hq,128,dtype=torch.bfloat16,device="cuda"); k=torch.randn(b,s,hkv,128,dtype=torch.bfloat16,device="cuda")
    t=ms(lambda: fa.flash_attn_func(q,k,k,causal=causal))
    fl=4*b*hq*s*s*128*(0.5 if causal else 1)
    print(b,s,hq,hkv,causal, f"{t:.3f} ms {fl/t/1e9:.0f} TF")

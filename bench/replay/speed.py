# Replay speed, one build against another: best events/s of N alternating runs (a shared machine's noise only
# slows a run, so the best is the least disturbed). usage: python3 bench/replay/speed.py BASE_NOFRAG NEW_NOFRAG [N]
# usage: python3 speed.py BASE_NOFRAG NEW_NOFRAG [N]
import sys, json, subprocess, statistics
base, new = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 5
live = {'vit': 10196391268, 'gpt2': 24919527212, 'llama1b_fsdp': None}
def run(nf, t, args):
    out = subprocess.run([nf, 'replay', f'../shared/traces/{t}.trace.gz', '--json'] + args, capture_output=True, text=True).stdout
    return json.loads(out[out.index('{'):out.rindex('}') + 1])
for t in ['vit', 'gpt2', 'llama1b_fsdp']:
    pl = run(new, t, [])['peak_live']
    for name, args in [('uncapped', []), ('1.01x', ['--limit', str(int(pl * 1.01))])]:
        r = {base: [], new: []}
        for _ in range(N):
            for nf in (base, new):
                r[nf].append(run(nf, t, args)['events_per_second'])
        b, n = max(r[base]), max(r[new])  # best of N: the machine is shared, noise only slows
        print(f"{t:13s} {name:9s} base {b/1e6:.2f} M/s  views {n/1e6:.2f} M/s  ratio {n/b:.3f}", flush=True)

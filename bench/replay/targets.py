# Issue 13 replay targets: calls in the second half, peak physical / live and speed, uncapped, at 1.01x
# live and at the minimum capacity, for the three shared traces.
# usage: python3 bench/replay/targets.py NOFRAG_BIN [extra replay args...]  (from the repository root)
import sys, json, subprocess
nf = sys.argv[1]; extra = sys.argv[2:]
def run(t, args):
    out = subprocess.run([nf, 'replay', f'../shared/traces/{t}.trace.gz', '--json'] + extra + args,
                         capture_output=True, text=True).stdout
    return json.loads(out[out.index('{'):out.rindex('}')+1])
for t in ['vit', 'gpt2', 'llama1b_fsdp']:
    u = run(t, [])
    live = u['peak_live']
    m = run(t, ['--min-capacity'])
    mc = m['min_capacity']
    rows = [('uncapped', u)]
    lim101 = int(live * 1.01)
    rows.append(('1.01x', run(t, ['--limit', str(lim101)])))
    rows.append(('min %d (%.4f)' % (mc, m['min_capacity_ratio']), run(t, ['--limit', str(mc)])))
    for name, d in rows:
        c = d['calls']
        print(f"{t:13s} {name:28s} status={d['status']:4s} calls2={d['calls_second_half']:6d} phys/live={d['peak_physical']/live:.4f} "
              f"ev/s={d['events_per_second']/1e6:.2f}M map={c['map']} unmap={c['unmap']} sa={c['set_access']} "
              f"rec={c['event_record']} q={c['event_query']} sync={c['event_sync']} wait={c['stream_wait']} create={c['create']}", flush=True)

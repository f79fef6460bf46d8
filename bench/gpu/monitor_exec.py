# usage (GPU machine, repository root, after bench/gpu/build.sh's nf_build_lib): python3 bench/gpu/monitor_exec.py
# The monitor under the PyTorch plug-in: a process that enabled nofrag.torch and
# allocated is listed live by `nofrag top`; after it exec()s (same pid) it is not.
import json, os, subprocess, sys, time
cli = os.path.abspath('build/nofrag')
child = r'''
import os, sys, torch, nofrag.torch
nofrag.torch.enable(limit="4GiB")
x = torch.ones(1 << 20, device="cuda"); torch.cuda.synchronize()
print("ready", os.getpid(), flush=True)
sys.stdin.readline()
os.execv("/bin/sleep", ["sleep", "30"])
'''
env = dict(os.environ, PYTHONPATH=os.path.abspath('python'), NOFRAG_LIB=os.path.abspath('build/libnofrag.so'))
p = subprocess.Popen([sys.executable, '-c', child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
line = p.stdout.readline().split()
res = {'child': line}
def top():
    out = subprocess.run([cli, 'top', '--once', '--json'], capture_output=True, text=True).stdout
    return [e for e in json.loads(out) if str(e.get('pid')) == line[1]] if len(line) > 1 else None
res['before_exec'] = top()
p.stdin.write('go\n'); p.stdin.flush()
time.sleep(2)
res['after_exec'] = top()
res['pid_alive_after_exec'] = os.path.exists('/proc/%s' % line[1]) if len(line) > 1 else None
res['clean'] = subprocess.run([cli, 'top', '--clean'], capture_output=True, text=True).stdout.strip()
p.kill(); p.wait()
res['ok'] = bool(res['before_exec']) and res['after_exec'] == [] and res['pid_alive_after_exec']
print(json.dumps(res, indent=1))

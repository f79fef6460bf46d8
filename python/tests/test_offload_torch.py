"""nofrag.torch's offload helpers (offload / prefetch / block_tiers,
offload_optimizer, offload_activations) without torch and without a GPU.

    NOFRAG_LIB=build/libnofrag.so python3 -m unittest discover -s python/tests -v

A small fake ``torch`` module (fake_torch.py) stands in for what nofrag.torch_offload touches
(tensors are blocks of the plug-in's host-backend pool; streams and events log
what waits on what; saved-tensor hooks, forward hooks and the optimizer's step
hooks are called as PyTorch calls them). Every test runs twice: against the
library's nf_offload / nf_prefetch (skipped when the library lacks them) and
against a simulator that poisons offloaded bytes, so that a hook letting its
caller read an offloaded tensor shows up as wrong data.

TestRealTorch runs a round trip with real torch on a GPU, in a subprocess
(skipped without torch + CUDA).
"""

import collections
import os
import subprocess
import sys
import types
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))
sys.path.insert(0, HERE)

import nofrag  # noqa: E402
import nofrag.torch as nft  # noqa: E402
from nofrag import _lib, _offload_activations, torch_offload  # noqa: E402
from fake_torch import (AccumulateGrad, FakeModule, FakeParameter, FakeStorage, FakeTensor,  # noqa: E402
                        FakeTorch, MulBackward0, Simulator, ToCopyBackward0, _Handle, fake_backward,
                        fake_save)
from test_offload import HAVE_OFFLOAD, LIB, MiB, NO_OFFLOAD, pattern  # noqa: E402


class TorchHelpersBase:
    """Runs against the library (TestTorchHelpersLib) or the simulator."""
    simulate = False

    def setUp(self):
        self.throw = LIB.nf_torch_set_throw(0)
        LIB.nf_torch_shutdown()
        nofrag.configure("backend:host,host_capacity:512MiB,granule:2MiB,limit:128MiB")
        self.fake = FakeTorch()
        FakeTorch.log.clear()
        torch_offload._streams.clear()
        self.patches = [mock.patch.dict(sys.modules, {"torch": self.fake})]
        if self.simulate:
            self.sim = Simulator()
            self.patches += [mock.patch.object(torch_offload, "_nf_offload", self.sim.offload),
                             mock.patch.object(torch_offload, "_nf_prefetch", self.sim.prefetch),
                             mock.patch.object(torch_offload, "_nf_block_tiers", self.sim.block_tiers),
                             # offload_activations calls them from its own module
                             mock.patch.object(_offload_activations, "_nf_offload", self.sim.offload),
                             mock.patch.object(_offload_activations, "_nf_prefetch", self.sim.prefetch)]
        for p in self.patches:
            p.start()
        self.blocks = []

    def tearDown(self):
        for p in reversed(self.patches):
            p.stop()
        for ptr, n in self.blocks:
            LIB.nf_torch_free(ptr, n, 0, None)
        LIB.nf_torch_shutdown()
        LIB.nf_torch_configure(None)
        LIB.nf_torch_set_throw(self.throw)

    def tensor(self, n, seed=None, cls=FakeTensor, **kw):
        ptr = LIB.nf_torch_alloc(n, 0, None)
        self.assertTrue(ptr, _lib.last_error())
        self.blocks.append((ptr, n))
        t = cls(FakeStorage(ptr, n), **kw)
        if seed is not None:
            t.fill(seed)
        return t

    def tiers(self, t):
        if not self.simulate:
            nofrag.offload_wait(nft.pool(0))
        return nft.block_tiers(t)

    def assert_data(self, t, seed):
        self.assertEqual(t.bytes(), pattern(seed, t.untyped_storage().nbytes()), "tensor data changed")

    # ---------------------------------------------------------------- tests
    def test_offload_prefetch_tensor(self):
        t = self.tensor(8 * MiB, seed=1)
        self.assertIs(nft.offload(t), t)
        self.assertGreater(self.tiers(t)["host"], 0)
        self.assertIs(nft.prefetch(t), t)
        self.assertEqual(self.tiers(t)["host"], 0)
        self.assert_data(t, 1)
        with self.assertRaises(ValueError):
            nft.offload(FakeTensor(FakeStorage(0, 0), cuda=False))
        empty = FakeTensor(FakeStorage(0, 0))
        self.assertIs(nft.offload(empty), empty)  # empty storage: left alone, no error
        self.assertEqual(nft.block_tiers(empty), {"device": 0, "host": 0, "disk": 0})

    def test_activation_recording_rules(self):
        w = self.tensor(8 * MiB, seed=2, cls=FakeParameter, requires_grad=True)  # parameter
        buf = self.tensor(8 * MiB, seed=3)                                   # buffer / input: leaf
        act = self.tensor(8 * MiB, seed=4, grad_fn=MulBackward0())           # activation
        small = self.tensor(64 * 1024, seed=5, grad_fn=MulBackward0())       # under min_bytes
        cast = self.tensor(4 * MiB, seed=6, grad_fn=ToCopyBackward0(AccumulateGrad()))  # autocast weight cast
        act2 = self.tensor(6 * MiB, seed=7, grad_fn=MulBackward0())
        with nft.offload_activations(min_bytes=1 * MiB) as ctx:
            nodes = [fake_save(w, act), fake_save(w.view(), buf, small), fake_save(act.view(), cast),
                     fake_save(act2, act)]
            # during forward nothing moves: the forward may still read what it saved
            self.assertEqual(self.tiers(act)["host"], 0)
        self.assertEqual(ctx.stats["packed"], 9)
        self.assertEqual(ctx.stats["recorded_storages"], 2)  # act (3 saves, one a view) and act2
        self.assertEqual(ctx.stats["offloaded_storages"], 2)
        for t in (w, buf, small, cast):
            self.assertEqual(self.tiers(t)["host"], 0)
        self.assertGreater(self.tiers(act)["host"], 0)
        self.assertGreater(self.tiers(act2)["host"], 0)
        self.assertFalse(ctx.resident())
        seen = []

        def check(t):  # every unpacked tensor is resident and intact
            ptr = t.untyped_storage().data_ptr()
            seed = {a.untyped_storage().data_ptr(): s for a, s in ((w, 2), (buf, 3), (act, 4), (small, 5),
                                                                    (cast, 6), (act2, 7))}[ptr]
            self.assertEqual(self.tiers(t)["host"], 0)
            self.assert_data(t, seed)
            seen.append(seed)

        fake_backward(nodes, check)
        self.assertEqual(seen, [7, 4, 4, 6, 2, 3, 5, 2, 4])
        self.assertTrue(ctx.resident())
        self.assertEqual(ctx.stats["prefetched_storages"], 2)
        # the consumer stream (1) waited for the copies before using them
        self.assertTrue(any(e[0] == "wait_event" and e[1] == 1 for e in FakeTorch.log), FakeTorch.log)

    def test_activation_prefetch_ahead_and_end_of_backward(self):
        acts = [self.tensor(4 * MiB, seed=10 + i, grad_fn=MulBackward0()) for i in range(6)]
        with nft.offload_activations(min_bytes=1 * MiB, ahead=2) as ctx:
            nodes = [fake_save(a) for a in acts]
            extra = fake_save(self.tensor(4 * MiB, seed=30, grad_fn=MulBackward0()))  # never unpacked
        self.assertEqual(ctx.stats["offloaded_storages"], 7)
        # unpack the last three only (a backward that stops early): the next ones come ahead
        fake_backward(nodes[3:], lambda t: self.assertEqual(self.tiers(t)["host"], 0))
        self.assertGreaterEqual(ctx.stats["prefetched_ahead"], 2)
        # the end-of-backward callback brought back everything still alive
        self.assertTrue(ctx.resident())
        for i, a in enumerate(acts):
            self.assertEqual(self.tiers(a)["host"], 0)
            self.assert_data(a, 10 + i)
        self.assertEqual(self.tiers(extra[0][0].t)["host"], 0)

    def test_activation_dead_storage_is_skipped(self):
        a = self.tensor(4 * MiB, seed=40, grad_fn=MulBackward0())
        with nft.offload_activations(min_bytes=1 * MiB) as ctx:
            node = fake_save(a)
            del node  # the graph holding it is gone before the forward ends
        self.assertEqual(ctx.stats["recorded_storages"], 1)
        self.assertEqual(ctx.stats["offloaded_storages"], 0)
        self.assertEqual(self.tiers(a)["host"], 0)

    def test_activation_layers_mode(self):
        layers = [FakeModule() for _ in range(3)]
        h = self.tensor(4 * MiB, seed=50, grad_fn=MulBackward0())
        inner, outs, nodes = [], [], []
        with nft.offload_activations(min_bytes=1 * MiB, layers=layers) as ctx:
            x = h
            for i, m in enumerate(layers):
                def body(x, i=i):
                    self.assert_data(x, 50 if i == 0 else 70 + i - 1)  # the layer reads its input
                    a = self.tensor(4 * MiB, seed=60 + i, grad_fn=MulBackward0())
                    inner.append(a)
                    nodes.append(fake_save(x, a))  # an op saving the layer input and an internal result
                    out = self.tensor(4 * MiB, seed=70 + i, grad_fn=MulBackward0())
                    nodes.append(fake_save(out))   # an op saving its output
                    return (out, {"aux": None})    # nested output structure
                x = m(body, x, mask=None)[0]
                outs.append(x)
                self.assertGreater(self.tiers(inner[-1])["host"], 0)  # moved as soon as the layer returned
                self.assertEqual(self.tiers(x)["host"], 0)            # the next layer reads it
            head = self.tensor(4 * MiB, seed=80, grad_fn=MulBackward0())  # saved outside the layers (the head)
            nodes.append(fake_save(head))
        self.assertEqual(self.tiers(head)["host"], 0)  # outside=False by default with layers: needed first
        self.assertEqual([len(m.pre) + len(m.post) for m in layers], [0, 0, 0])  # hooks removed at exit
        self.assertEqual(ctx.stats["offloaded_storages"], 3)
        self.assertEqual(ctx.stats["kept_as_layer_io"], 4)  # h and out1 (layer 1), out2, out3
        fake_backward(nodes, lambda t: self.assertEqual(self.tiers(t)["host"], 0))
        for i, a in enumerate(inner):
            self.assert_data(a, 60 + i)
        self.assertTrue(ctx.resident())
        with self.assertRaises(ValueError):
            nft.offload_activations(layers=[FakeModule(gradient_checkpointing=True)])

    def test_optimizer_state_offload(self):
        params = [self.tensor(8 * MiB, cls=FakeParameter, requires_grad=True) for _ in range(3)]
        test = self

        class Opt:
            def __init__(self):
                self.param_groups = [{"params": params}]
                self.state = collections.defaultdict(dict)
                self.pre, self.post, self.sd = [], [], []
                self.steps = 0

            def register_step_pre_hook(self, fn):
                self.pre.append(fn)
                return _Handle(self.pre, fn)

            def register_step_post_hook(self, fn):
                self.post.append(fn)
                return _Handle(self.post, fn)

            def register_state_dict_pre_hook(self, fn):
                self.sd.append(fn)
                return _Handle(self.sd, fn)

            def state_dict(self):
                for h in list(self.sd):
                    h(self)
                return {id(p): dict(s) for p, s in self.state.items()}

            def step(self):
                for h in list(self.pre):
                    h(self, (), {})
                for i, p in enumerate(params):  # the step reads and writes every state tensor
                    st = self.state[p]
                    if not st:
                        st["step"] = FakeTensor(FakeStorage(0, 8), cuda=False)
                        st["exp_avg"] = test.tensor(8 * MiB)
                        st["exp_avg_sq"] = test.tensor(8 * MiB)
                        st["tiny"] = test.tensor(4096)
                    else:
                        for k, s in (("exp_avg", 0), ("exp_avg_sq", 1)):
                            test.assertEqual(test.tiers(st[k])["host"], 0, "state read while offloaded")
                            test.assert_data(st[k], 100 * self.steps + 10 * i + s)
                    st["exp_avg"].fill(100 * (self.steps + 1) + 10 * i)
                    st["exp_avg_sq"].fill(100 * (self.steps + 1) + 10 * i + 1)
                self.steps += 1
                for h in list(self.post):
                    h(self, (), {})

        opt = Opt()
        h = nft.offload_optimizer(opt, min_bytes=1 * MiB)
        for step in range(3):
            if step:
                for p in reversed(params[1:]):  # backward: grads of two params are ready
                    for hook in p.post_acc_hooks:
                        hook(p)
            opt.step()
            for p in params:  # between steps the big state is on the host, the tiny one is not
                st = opt.state[p]
                self.assertGreater(self.tiers(st["exp_avg"])["host"], 0)
                self.assertGreater(self.tiers(st["exp_avg_sq"])["host"], 0)
                self.assertEqual(self.tiers(st["tiny"])["host"], 0)
        self.assertEqual(h.stats["steps"], 3)
        self.assertEqual(h.stats["offloaded_tensors"], 18)
        self.assertEqual(h.stats["prefetched_in_backward"], 8)  # 2 params x 2 tensors x 2 steps
        self.assertEqual(h.offloaded_bytes, 6 * 8 * MiB)
        # the step's stream waited for the prefetch stream
        self.assertTrue(any(e[0] == "wait_stream" and e[1] == 1 for e in FakeTorch.log))
        opt.state_dict()  # prefetches first (hook)
        self.assertEqual(h.offloaded_bytes, 0)
        for i, p in enumerate(params):
            self.assert_data(opt.state[p]["exp_avg"], 300 + 10 * i)
        opt.step()
        h.remove()
        self.assertEqual((opt.pre, opt.post, opt.sd), ([], [], []))
        self.assertEqual(sum(len(p.post_acc_hooks) for p in params), 0)
        for i, p in enumerate(params):
            self.assertEqual(self.tiers(opt.state[p]["exp_avg_sq"])["host"], 0)
            self.assert_data(opt.state[p]["exp_avg_sq"], 400 + 10 * i + 1)


    def test_resident_remove_waits_for_the_state_device(self):
        # mode="resident": the step used the state in place; remove() must
        # wait for that work on the state's device (cuda:1 here, while cuda:0
        # is current) before prefetching it: torch.cuda.synchronize() waited
        # for the current device only.
        ptr = LIB.nf_torch_alloc(8 * MiB, 1, None)
        self.assertTrue(ptr, _lib.last_error())
        self.addCleanup(LIB.nf_torch_free, ptr, 8 * MiB, 1, None)
        t = FakeTensor(FakeStorage(ptr, 8 * MiB))
        t.device.index = 1
        hooks = []
        opt = types.SimpleNamespace(param_groups=[], state={"p": {"exp_avg": t}},
                                    register_step_pre_hook=lambda fn: _Handle(hooks, fn),
                                    register_step_post_hook=lambda fn: _Handle(hooks, fn))
        h = nft.offload_optimizer(opt, mode="resident", min_bytes=MiB)
        # (the module torch_resident as imported now: sys.modules is restored between tests)
        with mock.patch.dict(type(h).remove.__globals__,
                             {"_nf_prefetch": lambda pool, p, stream=None: FakeTorch.log.append(("prefetch", pool, p))}):
            FakeTorch.log.clear()
            h.remove()
        self.assertEqual(FakeTorch.log, [("synchronize", 1), ("prefetch", LIB.nf_torch_pool(1), ptr)])

    def test_resident_failed_step_ends_host_placement(self):
        # A step that raises (an OOM, caught and retried) skips the post
        # hooks; the host placement its pre hook set must end all the same,
        # or every later allocation >= min_bytes on this thread (forward
        # activations too) goes to host memory. remove() gives opt.step back.
        hooks = {"pre": [], "post": []}

        class Param:  # hashable, as a torch parameter: the optimizer's state is keyed by it
            grad = object()

        class Opt:
            def __init__(self):
                self.param_groups = [{"params": [Param()]}]
                self.state = {}

            def register_step_pre_hook(self, fn):
                hooks["pre"].append(fn)
                return _Handle(hooks["pre"], fn)

            def register_step_post_hook(self, fn):
                hooks["post"].append(fn)
                return _Handle(hooks["post"], fn)

            def step(self, fail=False):  # torch.optim's order: pre hooks, the step, post hooks unless it raised
                for h in list(hooks["pre"]):
                    h(self, (), {})
                self.seen = LIB.nf_torch_set_host_alloc(0)  # what was in force during the step (and 0 now)
                LIB.nf_torch_set_host_alloc(self.seen)
                if fail:
                    raise RuntimeError("CUDA out of memory")
                for h in list(hooks["post"]):
                    h(self, (), {})

        opt = Opt()
        h = nft.offload_optimizer(opt, mode="resident", min_bytes=MiB)
        with self.assertRaises(RuntimeError):
            opt.step(fail=True)
        self.assertEqual(opt.seen, MiB)  # the placement was on during the step
        self.assertEqual(LIB.nf_torch_set_host_alloc(0), 0, "host placement left on after a failed step")
        opt.step()
        self.assertEqual(opt.seen, MiB)
        self.assertEqual(LIB.nf_torch_set_host_alloc(0), 0)
        h.remove()
        self.assertNotIn("step", vars(opt))  # the class's step again
        self.assertEqual(hooks, {"pre": [], "post": []})

class TestTorchHelpersSimulated(TorchHelpersBase, unittest.TestCase):
    simulate = True


@unittest.skipUnless(HAVE_OFFLOAD, NO_OFFLOAD)
class TestTorchHelpersLib(TorchHelpersBase, unittest.TestCase):
    simulate = False


GPU_SCRIPT = r"""
import sys, torch, nofrag, nofrag.torch as nft
nft.enable(spill="host")
x = torch.arange(4 << 20, device="cuda", dtype=torch.float32)
ref = x.clone()
ptr = x.data_ptr()
nft.offload(x); nofrag.offload_wait(nft.pool(0))
assert nft.block_tiers(x)["host"] > 0, nft.block_tiers(x)
nft.prefetch(x); torch.cuda.synchronize()
assert x.data_ptr() == ptr and torch.equal(x, ref)
nft.offload(x, tier="host_detached"); nofrag.offload_wait(nft.pool(0))
assert nft.block_tiers(x)["host"] > 0, nft.block_tiers(x)
nft.prefetch(x); torch.cuda.synchronize()
assert x.data_ptr() == ptr and torch.equal(x, ref)
m = torch.nn.Linear(2048, 2048, device="cuda")
opt = torch.optim.AdamW(m.parameters())
h = nft.offload_optimizer(opt, min_bytes=1 << 20)
for _ in range(3):
    with nft.offload_activations(min_bytes=1 << 20):
        y = torch.relu(m(torch.randn(512, 2048, device="cuda"))) * 2
    y.sum().backward(); opt.step(); opt.zero_grad()
torch.cuda.synchronize()
assert h.stats["offloaded_tensors"] >= 2, h.stats
h.remove()
print("OK", nofrag.stats()["offloads"], nofrag.stats()["prefetches"])
"""


class TestRealTorch(unittest.TestCase):
    def test_gpu_round_trip(self):
        try:
            import torch
            ok = torch.cuda.is_available()
        except Exception:
            ok = False
        if not ok:
            self.skipTest("needs torch with CUDA")
        if not HAVE_OFFLOAD:
            self.skipTest(NO_OFFLOAD)
        env = dict(os.environ, PYTHONPATH=os.path.normpath(os.path.join(HERE, "..")), NOFRAG_LIB=_lib.path())
        r = subprocess.run([sys.executable, "-c", GPU_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-3000:])
        self.assertIn("OK", r.stdout)


if __name__ == "__main__":
    unittest.main()

// GPU test, backend faults (see test_cuda.c): the CUDA backend wrapped in the
// fault-injection backend (src/backend/fault.c), on real device memory, as
// tests/test_fault.c's test_offload_paths_fail_once does on the host backend.
// A reference run of a small fixed workload (allocs, offloads to the host and
// detached host tiers, prefetches, waits, frees and allocs again, views on)
// counts its backend calls; then one run per call number n in which call n
// fails (every k-th n: as many runs as fit in FAULT_SECONDS, at most FAULT_RUNS). After each
// pool call, OK or not, every block the device may read holds its pattern: a
// failing call changes nothing (nofrag.h), unless its message says data was
// "lost" (counted apart and printed; that run reads no block again). Each run
// ends with the faults off: everything back and checked in full, freed,
// nf_pool_check, destroy.
#include "cuda_test.h"

#include <stdlib.h>
#include <string.h>

#define FAULT_RUNS 300
#ifndef FAULT_SECONDS
#define FAULT_SECONDS 30.0 // the sweep stops (not a failure) past this
#endif
#define FB_N 6
static const size_t MiB = 1u << 20;

typedef struct {
  nf_pool_t *pool;
  live_t b[FB_N];
  int where[FB_N]; // 0 on the device, else the tier it was offloaded to
  int lost;        // a call reported lost data: no block is read again this run
  int bad;         // blocks found with a wrong pattern
  int drv;         // a driver copy failed: the context may be broken, stop
  int errors;      // pool calls that returned an error
  uint64_t fail_at;
} frun_t;

// Check one 4 KiB slice per MiB of a block against its pattern (the word
// index is the slice's offset in the block). A slice per MiB sees every 2 MiB
// granule the block owns, so a granule lost or mapped at the wrong place
// shows; the full check is at the end of the run.
static int check_sampled(frun_t *r, const live_t *l) {
  uint32_t h[1024];
  for (size_t off = 0; off < l->n; off += MiB) {
    size_t len = l->n - off < sizeof h ? l->n - off : sizeof h;
    if (cuMemcpyDtoH(h, (CUdeviceptr)(l->p + off), len) != 0) { r->drv = 1; return 0; }
    for (size_t i = 0; i < len / 4; i++)
      if (h[i] != ((uint32_t)(l->tag * 2654435761u) ^ (uint32_t)(off / 4 + i))) return 0;
  }
  return 1;
}

// After a pool call: note a data-loss report; else read every block the
// device may read (resident, or offloaded to the host tier, which stays
// mapped; not detached ones, whose range may be unmapped).
static void after(frun_t *r, nf_status_t st, const char *what, int blk) {
  r->errors += st != NF_OK;
  if (st != NF_OK && strstr(nf_last_error(), "lost")) {
    printf("   fail_at %llu: %s (block %d) reported lost data: %s\n", (unsigned long long)r->fail_at, what, blk,
           nf_last_error());
    r->lost++;
  }
  for (int i = 0; i < FB_N && !r->lost && !r->drv; i++) {
    if (!r->b[i].p || (r->where[i] && r->where[i] != NF_TIER_HOST)) continue;
    if (!check_sampled(r, &r->b[i])) {
      r->bad++;
      if (r->bad <= 5)
        printf("   fail_at %llu: after %s (block %d -> %s: %s), block %d (where %d) %s\n",
               (unsigned long long)r->fail_at, what, blk, nf_status_str(st), st ? nf_last_error() : "", i,
               r->where[i], r->drv ? "could not be read (driver error)" : "lost its pattern");
    }
  }
}

static void f_alloc(frun_t *r, int i, size_t n, uint32_t tag) {
  void *p = nf_alloc(r->pool, n, NULL);
  r->b[i] = (live_t){(uintptr_t)p, p ? n : 0, tag};
  r->where[i] = 0;
  if (p) dev_fill((uintptr_t)p, n, tag);
  after(r, p ? NF_OK : nf_last_status(), "alloc", i);
}
static void f_free(frun_t *r, int i) {
  if (!r->b[i].p) return;
  nf_status_t st = nf_free(r->pool, (void *)r->b[i].p);
  if (st == NF_OK) r->b[i] = (live_t){0, 0, 0}, r->where[i] = 0; // else still live: freed at the end
  after(r, st, "free", i);
}
static void f_offload(frun_t *r, int i, nf_tier_t tier) {
  if (!r->b[i].p || r->where[i]) return;
  nf_status_t st = nf_offload(r->pool, (void *)r->b[i].p, NULL, tier);
  if (st == NF_OK) r->where[i] = (int)tier; // else it stays on the device, intact
  after(r, st, tier == NF_TIER_HOST ? "offload host" : "offload detached", i);
}
static void f_prefetch(frun_t *r, int i) {
  if (!r->b[i].p || !r->where[i]) return;
  nf_status_t st = nf_prefetch(r->pool, (void *)r->b[i].p, NULL);
  if (st == NF_OK) r->where[i] = 0; // else it stays offloaded, intact
  after(r, st, "prefetch", i);
}
static void f_wait(frun_t *r) { after(r, nf_offload_wait(r->pool), "offload_wait", -1); }

typedef struct { int bad, lost, drv, errors; } fsum_t;

// One run on the fault backend `fb`, call number base + fail_at failing (0:
// none); *calls gets the number of backend calls the run made.
static void fault_run(nf_backend_t *fb, uint64_t fail_at, uint64_t *calls, fsum_t *sum) {
  frun_t r = {.fail_at = fail_at};
  uint64_t base = 0, failed = 0, end = 0;
  nf_backend_fault_set(fb, 0, 0);
  nf_backend_fault_counts(fb, &base, &failed);
  nf_backend_fault_set(fb, fail_at ? base + fail_at : 0, 0);
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[256];
  OKP(nf_config_parse(&cfg, "limit:64MiB,granule:2MiB,views:4,spill:off", err, sizeof err));
  nf_status_t st = nf_pool_create(&r.pool, fb, &cfg);
  if (st != NF_OK) { // allowed when the failing call is one of the create's: nothing to check
    CHECK(fail_at != 0, "pool create without faults: %s", nf_last_error());
    nf_backend_fault_counts(fb, &end, &failed);
    *calls = end - base;
    return;
  }
  static const size_t sz[FB_N] = {10, 10, 10, 10, 10, 8}; // MiB, 58 of the 64: the alloc of 16 below must stitch
  for (int i = 0; i < FB_N; i++) f_alloc(&r, i, sz[i] * MiB, 900u + (uint32_t)i);
  f_offload(&r, 0, NF_TIER_HOST);
  f_offload(&r, 1, NF_TIER_HOST_DETACHED);
  f_offload(&r, 2, NF_TIER_HOST);
  f_wait(&r);
  f_free(&r, 3);
  if (!r.b[3].p) f_alloc(&r, 3, 16 * MiB, 910); // into the holes the offloads left: stitching / views
  f_prefetch(&r, 1);
  f_free(&r, 5);
  if (!r.b[5].p) f_alloc(&r, 5, 4 * MiB, 911);
  f_prefetch(&r, 0);
  f_offload(&r, 4, NF_TIER_HOST_DETACHED);
  f_prefetch(&r, 4); // its copy may still be in flight: the cancel path
  f_prefetch(&r, 2);
  f_wait(&r);
  f_offload(&r, 3, NF_TIER_HOST);
  f_free(&r, 3); // offloaded, copy maybe in flight
  if (!r.b[3].p) f_alloc(&r, 3, 12 * MiB, 912);
  f_offload(&r, 5, NF_TIER_HOST_DETACHED);
  f_offload(&r, 1, NF_TIER_HOST);
  f_wait(&r);
  nf_backend_fault_counts(fb, &end, &failed);
  *calls = end - base;
  // The end, faults off: everything back to the device and checked in full.
  nf_backend_fault_set(fb, 0, 0);
  if (!r.drv) {
    OKP(nf_offload_wait(r.pool));
    for (int i = 0; i < FB_N; i++) {
      if (!r.b[i].p) continue;
      if (r.where[i] && !r.lost) OKP(nf_prefetch(r.pool, (void *)r.b[i].p, NULL));
      if (!r.lost && !dev_check(r.b[i].p, r.b[i].n, r.b[i].tag)) {
        r.bad++;
        printf("   fail_at %llu: block %d lost its data (full check at the end)\n", (unsigned long long)fail_at, i);
      }
      OKP(nf_free(r.pool, (void *)r.b[i].p));
    }
    CHECK(nf_pool_check(r.pool) == NF_OK, "fail_at %llu: pool_check: %s", (unsigned long long)fail_at,
          nf_last_error());
  }
  if (!fail_at) { // what the workload exercised
    nf_stats_t ps;
    nf_stats_get(r.pool, &ps);
    printf("   reference run: reclaims %llu, view reuses %llu, view moves %llu, offloads %llu, prefetches %llu\n",
           (unsigned long long)ps.reclaims, (unsigned long long)ps.view_reuses, (unsigned long long)ps.view_moves,
           (unsigned long long)ps.offloads, (unsigned long long)ps.prefetches);
  }
  nf_pool_destroy(r.pool);
  CHECK(r.bad == 0, "fail_at %llu: %d blocks lost their data", (unsigned long long)fail_at, r.bad);
  CHECK(fail_at || r.errors == 0, "the reference run had %d failing pool calls", r.errors);
  sum->bad += r.bad;
  sum->lost += r.lost;
  sum->drv += r.drv;
  sum->errors += r.errors;
}

// `inner`: a CUDA backend of its own, owned (and destroyed) by the fault
// wrapper, which outlives every pool made on it.
void test_pool_backend_faults(nf_backend_t *inner) {
  printf("-- pool: every backend call fails once (fault backend over CUDA): data intact after each call\n");
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  nf_backend_t *fb = NULL;
  nf_status_t st = nf_backend_fault_create(&fb, inner, 0, 0, 1);
  CHECK(st == NF_OK, "fault backend: %s", nf_last_error());
  if (st != NF_OK) { nf_backend_destroy(inner); return; }
  uint64_t t = 0, free0 = 0, free1 = 0, total = 0, calls = 0, failed = 0;
  inner->ops->capacity(inner, NF_TIER_DEVICE, &t, &free0); // the inner's: not a counted call
  fsum_t sum = {0};
  int runs = 0;
  double tr = now_us();
  fault_run(fb, 0, &total, &sum);
  tr = now_us() - tr;
  CHECK(total > 40, "the reference run made only %llu backend calls", (unsigned long long)total);
  // As many runs as fit in the time (from the reference run's), spread over
  // every call number, not the first ones only.
  uint64_t fit = (uint64_t)(0.8 * FAULT_SECONDS * 1e6 / (tr > 1.0 ? tr : 1.0)), most = fit < FAULT_RUNS ? fit : FAULT_RUNS;
  if (most < 1) most = 1;
  uint64_t step = total > most ? (total + most - 1) / most : 1, n = 1;
  double t0 = now_us();
  for (; n <= total && !sum.drv && now_us() - t0 < FAULT_SECONDS * 1e6; n += step, runs++)
    fault_run(fb, n, &calls, &sum);
  CHECK(sum.drv == 0, "a driver copy failed during the sweep (at call %llu): stopped there", (unsigned long long)(n - step));
  nf_backend_fault_set(fb, 0, 0);
  nf_backend_fault_counts(fb, &calls, &failed);
  inner->ops->capacity(inner, NF_TIER_DEVICE, &t, &free1);
  printf("   reference run %llu backend calls; %d runs (every %llu%s) in %.1f s: %llu calls failed, %d pool "
         "calls returned an error; %d blocks lost data unreported, %d data-loss reports; device memory not "
         "returned %lld MiB\n", (unsigned long long)total, runs, (unsigned long long)step,
         n <= total ? ", stopped by time" : "", (now_us() - t0) / 1e6, (unsigned long long)failed, sum.errors,
         sum.bad, sum.lost, ((long long)free0 - (long long)free1) >> 20);
  fprintf(jout, "\"backend_faults\": {\"calls\": %llu, \"runs\": %d, \"step\": %llu, \"failed\": %llu, "
                "\"pool_errors\": %d, \"bad_blocks\": %d, \"lost_reports\": %d},\n", (unsigned long long)total,
          runs, (unsigned long long)step, (unsigned long long)failed, sum.errors, sum.bad, sum.lost);
  nf_backend_destroy(fb); // and inner
}

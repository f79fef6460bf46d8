// libFuzzer target for the allocation API: the input is a program of
// alloc / free (nf_free, nf_free_ex) / bad free / record_stream / trim / set_limit / offload /
// prefetch operations on a small host-backend pool that spills to host memory. Every live block carries a pattern that must
// survive every operation, and the pool's invariants must hold throughout. Operations name up to 128
// streams and up to 96 blocks live at once: more streams holding live blocks than a pool's 64 slots,
// so slots are recycled and taken (orphans re-homed at free, offload and prefetch); a refusal
// (NF_ERR_UNSUPPORTED: every slot named otherwise) is accepted, and the patterns and the pool
// check must hold after it as after any other operation.
// Inputs of a length not a multiple of 4 end in a configuration byte (units, tight, views off, edges off).
// Stream order is checked too: the host backend's events complete only when an op says so
// (or the pool waits for them), each allocation declares its stream's work on the block
// (and record_stream the other stream's), and the backend counts every reuse or unmap of
// memory that is not ordered after the work declared on it (nf_backend_host_violations).
#include "nofrag.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define G (64 * 1024)
#define SLOTS 96

static void fill(void *p, size_t n, uint8_t tag) {
  unsigned char *c = p;
  c[0] = tag;
  if (n > 1) c[n - 1] = (uint8_t)~tag;
  if (n > 2) c[n / 2] = (uint8_t)(tag ^ 0x5A);
}

static int ok(const void *p, size_t n, uint8_t tag) {
  const unsigned char *c = p;
  return c[0] == tag && (n == 1 || c[n - 1] == (uint8_t)~tag) && (n <= 2 || c[n / 2] == (uint8_t)(tag ^ 0x5A));
}

// Whether nf_offload moved the block at q (the snapshot names it "offloaded"). An offload
// that returns NF_OK may leave a block where it is: one with no granule of its own, or, to
// the host tier, one whose own granules are all spilled (nofrag.h, nf_offload). Such a block
// is not offloaded: it stays readable, and a later offload to another tier may move it.
static int offloaded(nf_pool_t *p, const void *q) {
  char key[64], *j = nf_snapshot(p);
  if (!j) abort();
  snprintf(key, sizeof key, "{\"addr\":\"0x%llx\",\"size\":", (unsigned long long)(uintptr_t)q);
  char *b = strstr(j, key), *e = b ? strchr(b, '}') : NULL;
  if (!e) abort(); // a live block is in the snapshot
  *e = 0;
  int r = strstr(b, "\"offloaded\"") != NULL;
  nf_snapshot_free(j);
  return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static nf_backend_t *be;
  setenv("NOFRAG_MONITOR", "0", 0); // a pool per input: no shared-memory file each time
  setenv("NOFRAG_QUIET_SPILL", "1", 0);
  setenv("NOFRAG_QUIET_OOM", "1", 0);
  if (!be && nf_backend_host_create(&be, 1ull << 30, G) != NF_OK) abort();
  nf_config_t c;
  nf_config_default(&c);
  c.limit = 48 * G;
  c.small_max = 8192;
  c.release_threshold = 8 * G;
  c.release_after = 4;
  c.spill = 1;
  c.spill_limit = 32 * G;
  // An input whose length is not a multiple of 4 ends in a configuration byte: bits for units
  // of 4 granules, tight, views off, no release decay and edge sharing off.
  uint8_t conf = size % 4 ? data[size - 1] : 0;
  if (conf & 1) c.units = 4;
  if (conf & 2) c.tight = 1;
  if (conf & 4) c.views = 0;
  if (conf & 8) c.release_after = 0;
  if (conf & 16) c.edges = 0; // (on by default)
  nf_pool_t *p;
  if (nf_pool_create(&p, be, &c) != NF_OK) abort();
  nf_backend_host_set_manual_events(be, 1);
  uint64_t v0 = nf_backend_host_violations(be);
  struct { void *p; size_t n; uint8_t tag, where; } l[SLOTS] = {{0}};
  for (size_t i = 0; i + 4 <= size; i += 4) {
    uint8_t op = data[i] % 10, slot = data[i + 1] % SLOTS;
    uint16_t arg = (uint16_t)(data[i + 2] | data[i + 3] << 8);
    // 128 streams (0: the default one): 3 bits of the slot byte, 4 of the argument's high byte.
    nf_stream_t s = (nf_stream_t)(uintptr_t)((data[i + 1] >> 5) | (data[i + 3] & 0x0F) << 3);
    switch (op) {
    case 0: case 1: case 2: { // alloc: small, medium, large
      if (l[slot].p) break;
      size_t n = op == 0 ? arg % 8192 + 1 : op == 1 ? (size_t)arg * 16 + 1 : (size_t)arg * 64 + 1;
      void *q = nf_alloc(p, n, s);
      if (!q) {
        if (nf_last_status() == NF_OK) abort();
        break;
      }
      nf_backend_host_use_new(be, s, q, n); // ordered after every earlier user of this memory?
      nf_backend_host_use(be, s, q, n);     // s works on it from now on
      fill(q, n, data[i + 2]);
      l[slot].p = q; l[slot].n = n; l[slot].tag = data[i + 2]; l[slot].where = 0;
      break;
    }
    case 3: case 4: // free
      if (!l[slot].p) break;
      if ((!l[slot].where || l[slot].where == NF_TIER_HOST) && !ok(l[slot].p, l[slot].n, l[slot].tag)) abort();
      if (op == 3) {
        if (nf_free(p, l[slot].p) != NF_OK) abort();
      } else { // the probing free reports the requested size
        size_t n = 0;
        if (nf_free_ex(p, l[slot].p, &n, NF_FREE_PROBE) != NF_OK || n != l[slot].n) abort();
      }
      l[slot].p = NULL;
      break;
    case 5: // bad frees: interior, unknown; must change nothing (a probe: quiet for a pointer outside the pool)
      if (l[slot].p && l[slot].n > 512 && nf_free(p, (char *)l[slot].p + 512) != NF_ERR_INVALID) abort();
      if (l[slot].p && l[slot].n > 512 && nf_free_ex(p, (char *)l[slot].p + 512, NULL, NF_FREE_PROBE) != NF_ERR_INVALID)
        abort();
      if (nf_free(p, (void *)(uintptr_t)(arg * 4096 + 8)) != NF_ERR_INVALID) abort();
      if (nf_free_ex(p, (void *)(uintptr_t)(arg * 4096 + 8), NULL, NF_FREE_PROBE) != NF_ERR_FOREIGN) abort();
      break;
    case 6:
      if (l[slot].p) {
        nf_status_t r = nf_record_stream(p, l[slot].p, s);
        if (r != NF_OK && r != NF_ERR_UNSUPPORTED) abort();
        // Work on it only while it is on the device: from nf_offload until nf_prefetch the
        // caller may not use a block (nofrag.h), so such work would be the harness's fault.
        if (r == NF_OK && !l[slot].where) nf_backend_host_use(be, s, l[slot].p, l[slot].n);
      }
      break;
    case 7:
      if (arg % 4 == 3) nf_backend_host_complete_events(be); // the streams' work so far is done
      else if (arg % 2) nf_trim(p);
      else nf_set_limit(p, (uint64_t)(arg % 64 + 8) * G);
      break;
    case 8: { // offload: host, detached or disk; refused only for a block on another tier or no host room
      if (!l[slot].p) break;
      nf_tier_t t = arg % 3 == 0 ? NF_TIER_DISK : arg % 3 == 1 ? NF_TIER_HOST_DETACHED : NF_TIER_HOST;
      nf_status_t r = nf_offload(p, l[slot].p, s, t);
      if (r == NF_OK && l[slot].where && l[slot].where != t) abort(); // to another tier: NF_ERR_INVALID
      if (r == NF_OK) l[slot].where = l[slot].where ? l[slot].where : offloaded(p, l[slot].p) ? (uint8_t)t : 0;
      else if (!(r == NF_ERR_INVALID && ((l[slot].where && l[slot].where != t) || c.units > 1)) && r != NF_ERR_OOM &&
               r != NF_ERR_UNSUPPORTED)
        abort(); // (with units: a block over part of a unit is refused, NF_ERR_INVALID)
      break;
    }
    case 9: // prefetch (may find no device room), or wait for copies
      if (arg % 4 == 0) { if (nf_offload_wait(p) != NF_OK) abort(); break; }
      if (!l[slot].p) break;
      if (nf_prefetch(p, l[slot].p, s) == NF_OK) l[slot].where = 0;
      else if (nf_last_status() != NF_ERR_OOM && nf_last_status() != NF_ERR_UNSUPPORTED) abort();
      break;
    }
    // After every op of a short program, then every 8th: the check walks every granule, and
    // long programs (the >64-stream seeds) would run at a few per second; a bookkeeping
    // error usually persists to a later check (the final one included), and the patterns
    // are checked at every free all the same.
    if ((i / 4 < 64 || (i / 4) % 8 == 0) && nf_pool_check(p) != NF_OK) abort();
  }
  if (nf_pool_check(p) != NF_OK) abort();
  for (int k = 0; k < SLOTS; k++)
    if (l[k].p) {
      if ((!l[k].where || l[k].where == NF_TIER_HOST) && !ok(l[k].p, l[k].n, l[k].tag)) abort();
      nf_free(p, l[k].p);
    }
  uint64_t v = nf_backend_host_violations(be) - v0;
  if (v) { fprintf(stderr, "%llu unordered reuses or unmaps\n", (unsigned long long)v); abort(); }
  nf_backend_host_complete_events(be); // the work declared on the blocks is done: the pool may go
  nf_pool_destroy(p);
  if (nf_backend_host_violations(be) != v0) abort();
  nf_backend_host_set_manual_events(be, 0);
  uint64_t gr, mp;
  nf_backend_host_usage(be, &gr, &mp);
  if (gr || mp) { fprintf(stderr, "left: %llu granules, %llu mappings\n", (unsigned long long)gr, (unsigned long long)mp); abort(); }
  return 0;
}

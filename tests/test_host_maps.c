// Host backend at the kernel's bound on memory mappings (src/backend/host_maps.c,
// vm.max_map_count): unmap still works there, and a set_access that fails
// midway leaves the mappings as they were. Split from test_backend.c (files
// stay small); the bound met more than once is in test_backend_rules.c.
#include "backend_test.h"

#include <sys/mman.h>
#include <unistd.h>

// At the kernel's bound a map fails, and then the kernel refuses even the
// MAP_FIXED that puts the reservation back over a mapping being unmapped (it
// checks the count first, and the failed map left it one above the bound).
// The allocator rolls a failed request back granule by granule, so every such
// unmap must still succeed, quickly, without leaving a hole in the reserved
// range. Before the fix each failed (state left mapped), after a rescan of
// /proc/self/maps: a single huge request took hours to fail.
static void test_host_unmap_at_map_bound(void **state) {
  (void)state;
  enum { N = 64 };
  nf_backend_t *be = nft_host((N + 1) * G, G);
  uintptr_t keep = reserve(be, G), va = reserve(be, N * G);
  nf_handle_t hk = create(be, G), h[N];
  map_rw(be, keep, G, hk);
  nft_fill((void *)keep, G, 77);
  for (int i = 0; i < N; i++) h[i] = create(be, G);
  if (!nft_fill_maps_to(N / 2)) {
    nf_backend_destroy(be);
    print_message("skipping: vm.max_map_count unknown or too large to reach, or under TSan\n");
    skip();
  }
  // Fresh handles mapped the way the pool maps them (memfd offsets descending
  // as addresses ascend): no two mappings merge, each is a kernel mapping.
  int m = 0;
  nf_status_t st = NF_OK;
  while (m < N && (st = be->ops->map(be, va + (uintptr_t)m * G, G, h[N - 1 - m])) == NF_OK) m++;
  if (st == NF_OK) fail_msg("%d maps near vm.max_map_count all succeeded (%llu mappings now)", N,
                            (unsigned long long)nft_maps_now());
  assert_int_equal(st, NF_ERR_BACKEND);
  nft_err_has(be, "out of memory mappings");
  nft_err_has(be, "vm.max_map_count=");
  assert_true(m > 0);
  for (int i = 0; i < m; i++) { // the rollback, at the bound
    st = be->ops->unmap(be, va + (uintptr_t)i * G, G);
    if (st != NF_OK) fail_msg("unmap of granule %d of %d at the bound: %s", i, m, nf__backend_err());
  }
  nft_usage_is(be, N + 1, 1);
  for (int i = 0; i < N; i++) // still reserved, every granule: no hole another mmap could take
    if (msync((void *)(va + (uintptr_t)i * G), G, MS_ASYNC) != 0) fail_msg("granule %d is no longer reserved", i);
  assert_true(nft_check((void *)keep, G, 77));
  nft_filler_free();
  // Below the bound again: every granule maps, keeps data, and goes in one call.
  for (int i = 0; i < N; i++) map_rw(be, va + (uintptr_t)i * G, G, h[i]);
  for (int i = 0; i < N; i++) nft_fill((void *)(va + (uintptr_t)i * G), G, (uint64_t)i);
  for (int i = 0; i < N; i++) assert_true(nft_check((void *)(va + (uintptr_t)i * G), G, (uint64_t)i));
  assert_true(nft_check((void *)keep, G, 77));
  assert_int_equal(be->ops->unmap(be, va, N * G), NF_OK);
  assert_int_equal(be->ops->unmap(be, keep, G), NF_OK);
  for (int i = 0; i < N; i++) assert_int_equal(be->ops->mem_release(be, h[i]), NF_OK);
  assert_int_equal(be->ops->mem_release(be, hk), NF_OK);
  assert_int_equal(be->ops->va_release(be, va, N * G), NF_OK);
  assert_int_equal(be->ops->va_release(be, keep, G), NF_OK);
  nft_usage_is(be, 0, 0);
  nf_backend_destroy(be);
}

// The protection of the kernel mapping at va, from /proc/self/maps ("rw-s"...;
// "" when none starts there).
static void prot_at(uintptr_t va, char out[5]) {
  char want[32], line[512];
  snprintf(want, sizeof want, "%lx-", (unsigned long)va);
  out[0] = 0;
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, want, strlen(want))) {
      const char *sp = strchr(line, ' ');
      if (sp) snprintf(out, 5, "%s", sp + 1);
      break;
    }
  fclose(f);
}

// set_access over two mappings at vm.max_map_count: mprotect changes the
// first, then needs a split of the second (one more mapping) and fails. The
// failed op must leave the first without access, as it was (it left it
// writable: a forgotten set_access would not fault there).
static void test_host_set_access_fails_midway(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(8 * G, G);
  uintptr_t va = reserve(be, 3 * G);
  nf_handle_t hb2 = create(be, 2 * G), ha = create(be, G); // memfd offsets descending: the two never merge
  assert_int_equal(be->ops->map(be, va, G, ha), NF_OK);
  assert_int_equal(be->ops->map(be, va + G, 2 * G, hb2), NF_OK);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  char *r = NULL;
  if (nft_fill_maps_to(16))
    r = mmap(NULL, 64 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (!r || r == MAP_FAILED) {
    nft_filler_free();
    nf_backend_destroy(be);
    print_message("skipping: vm.max_map_count unknown or too large to reach, or under TSan\n");
    skip();
  }
  // To the bound exactly: each step splits one more page off the region's end
  // with a protection unlike both its neighbours' (one more mapping).
  int k = 0;
  while (k < 63 && mprotect(r + (63 - k) * page, page, k & 1 ? PROT_READ | PROT_WRITE : PROT_NONE) == 0) k++;
  assert_true(k < 63); // reached the bound
  nf_status_t st = be->ops->set_access(be, va, 2 * G); // all of a, half of b: b must split
  char prot[5];
  prot_at(va, prot);
  munmap(r, 64 * page);
  nft_filler_free();
  if (st == NF_OK) fail_msg("set_access needing a split at the bound succeeded");
  nft_err_has(be, "out of memory mappings");
  if (strncmp(prot, "---", 3)) fail_msg("the failed set_access left granule 0 with protection '%s'", prot);
  // Below the bound: the same call works, and the data go through.
  assert_int_equal(be->ops->set_access(be, va, 3 * G), NF_OK);
  nft_fill((void *)va, 3 * G, 5);
  assert_true(nft_check((void *)va, 3 * G, 5));
  assert_int_equal(be->ops->unmap(be, va, 3 * G), NF_OK);
  assert_int_equal(be->ops->mem_release(be, ha), NF_OK);
  assert_int_equal(be->ops->mem_release(be, hb2), NF_OK);
  assert_int_equal(be->ops->va_release(be, va, 3 * G), NF_OK);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_host_unmap_at_map_bound, nft_teardown_filler),
      cmocka_unit_test_teardown(test_host_set_access_fails_midway, nft_teardown_filler),
  };
  return cmocka_run_group_tests(tests, setup_granule, NULL);
}

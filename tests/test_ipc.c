// Sharing a block with another process (src/torch/ipc.c, PyTorch's CUDA IPC
// under the adapter), on the host backend: a child exports a live block, the
// parent imports it (pidfd_getfd), both see each other's writes, and closing
// the import leaves nothing mapped; bad handles give clear errors.
#include "nf_test.h"

#include "torch/torch.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define G (64 * 1024)

static nf_pool_t *pool_new(nf_backend_t **be) { return nft_pool(be, 64ull << 20, G, NULL); }

// The child: export a block that starts inside a granule and spans three,
// send the handle, wait for the parent's write, check it, free.
static int child(int wfd, int rfd) {
  nf_backend_t *be;
  nf_pool_t *p = pool_new(&be);
  if (!p) return 10;
  void *pad = nf_alloc(p, 5000, NULL); // the shared block starts mid-granule
  size_t n = 2 * G + 12345;
  unsigned char *b = nf_alloc(p, n, NULL);
  if (!pad || !b) return 11;
  nft_fill(b, n, 77);
  char h[4096];
  int fds[16];
  size_t nfds = 0;
  uint64_t off = 0;
  if (nf_ipc_export(p, b, h, sizeof h, fds, 16, &nfds, &off) != NF_OK) { fprintf(stderr, "%s\n", nf_last_error()); return 12; }
  if (nfds != 3 || off != ((uintptr_t)b & (G - 1))) return 13;
  char msg[4200];
  int len = snprintf(msg, sizeof msg, "%llu %s\n", (unsigned long long)off, h);
  if (write(wfd, msg, (size_t)len) != len) return 14;
  char c;
  if (read(rfd, &c, 1) != 1) return 15;
  if (!nft_check(b, n, 78)) return 16; // the parent's write
  for (size_t i = 0; i < nfds; i++) close(fds[i]);
  nf_free(p, b);
  nf_free(p, pad);
  if (nf_pool_check(p) != NF_OK) return 17;
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  return 0;
}

static void test_share_with_child(void **state) {
  (void)state;
  int down[2], up[2];
  assert_int_equal(pipe(down), 0);
  assert_int_equal(pipe(up), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(child(up[1], down[0]));
  nf_backend_t *be;
  nf_pool_t *p = pool_new(&be);
  assert_non_null(p);
  uint64_t g0 = 0, m0 = 0, g1 = 0, m1 = 0;
  nf_backend_host_usage(be, &g0, &m0);
  char msg[4200] = "";
  FILE *f = fdopen(up[0], "r");
  assert_non_null(fgets(msg, sizeof msg, f));
  unsigned long long off = strtoull(msg, NULL, 10);
  const char *h = strchr(msg, ' ') + 1;
  msg[strcspn(msg, "\n")] = 0;
  void *base = NULL;
  nf_ipc_map_t *m = NULL;
  nf_status_t st = nf_ipc_import(be, h, &base, &m);
  if (st != NF_OK) {
    kill(pid, SIGKILL);
    fail_msg("import: %s", nf_last_error());
  }
  size_t n = 2 * G + 12345;
  unsigned char *b = (unsigned char *)base + off;
  assert_true(nft_check(b, n, 77)); // the child's data
  nft_fill(b, n, 78);
  nf_ipc_close(m);
  nf_backend_host_usage(be, &g1, &m1);
  assert_int_equal(g1, g0); // nothing left mapped or held
  assert_int_equal(m1, m0);
  assert_int_equal(write(down[1], "x", 1), 1);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  // The child is gone: its handle names a dead process.
  assert_int_equal(nf_ipc_import(be, h, &base, &m), NF_ERR_INVALID);
  assert_non_null(strstr(nf_last_error(), "has exited"));
  assert_non_null(strstr(nf_last_error(), "ESRCH"));
  fclose(f);
  close(up[1]); close(down[0]); close(down[1]);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

static void test_errors(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool_new(&be);
  void *base;
  nf_ipc_map_t *m;
  assert_int_equal(nf_ipc_import(be, "garbage", &base, &m), NF_ERR_INVALID);
  assert_non_null(strstr(nf_last_error(), "not a nofrag handle"));
  char h[256];
  int fds[4];
  size_t nfds = 9;
  uint64_t off;
  void *b = nf_alloc(p, 100, NULL);
  assert_int_equal(nf_ipc_export(p, (char *)b + 8, h, sizeof h, fds, 4, &nfds, &off), NF_ERR_INVALID);
  assert_int_equal(nfds, 0);
  assert_int_equal(nf_ipc_export(p, b, h, 10, fds, 4, &nfds, &off), NF_ERR_INVALID); // buffer too small
  assert_int_equal(nfds, 0);
  // A handle naming this process: importing our own export works too.
  assert_int_equal(nf_ipc_export(p, b, h, sizeof h, fds, 4, &nfds, &off), NF_OK);
  assert_int_equal(nf_ipc_import(be, h, &base, &m), NF_OK);
  nf_ipc_close(m);
  for (size_t i = 0; i < nfds; i++) close(fds[i]);
  nf_free(p, b);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A shared block's device memory is mapped by the importer: offloading it
// would move the exporter's bytes away from what the importer sees, so it is
// refused (nothing changes); a block made later at the same place is not shared.
static void test_shared_block_stays(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool_new(&be);
  size_t n = 8 * G;
  void *b = nf_alloc(p, n, NULL);
  assert_non_null(b);
  nft_fill(b, n, 21);
  char h[512];
  int fds[16];
  size_t nfds = 0;
  uint64_t off;
  assert_int_equal(nf_ipc_export(p, b, h, sizeof h, fds, 16, &nfds, &off), NF_OK);
  void *base;
  nf_ipc_map_t *m;
  assert_int_equal(nf_ipc_import(be, h, &base, &m), NF_OK);
  nf_tier_t tiers[] = {NF_TIER_HOST, NF_TIER_HOST_DETACHED, NF_TIER_DISK};
  for (int t = 0; t < 3; t++) {
    assert_int_equal(nf_offload(p, b, NULL, tiers[t]), NF_ERR_INVALID);
    assert_non_null(strstr(nf_last_error(), "shared with another process"));
  }
  uint64_t bytes[3];
  assert_int_equal(nf_block_tiers(p, b, bytes), NF_OK);
  assert_int_equal(bytes[NF_TIER_HOST] + bytes[NF_TIER_DISK], 0);
  assert_true(nft_check(b, n, 21));
  assert_true(nft_check((char *)base + off, n, 21)); // the importer's view is the same memory
  nf_ipc_close(m);
  for (size_t i = 0; i < nfds; i++) close(fds[i]);
  assert_int_equal(nf_free(p, b), NF_OK);
  void *c = nf_alloc(p, n, NULL);
  assert_non_null(c);
  assert_int_equal(nf_offload(p, c, NULL, NF_TIER_HOST), NF_OK);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  assert_int_equal(nf_prefetch(p, c, NULL), NF_OK);
  assert_int_equal(nf_free(p, c), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// As on CUDA, host memory cannot be shared: a block that spill put partly
// in host memory is refused with a clear error (the CPU test would pass where
// the GPU fails otherwise); an import's extent must lie in the shared memory;
// the fault backend forwards (and counts) export and import.
static void test_ipc_refusals(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 64ull << 20, G, "limit:1MiB,spill:host,spill_limit:4MiB");
  assert_non_null(p);
  void *a = nf_alloc(p, 12 * G, NULL), *b = nf_alloc(p, 8 * G, NULL); // b: past the limit, spilled
  assert_true(a && b);
  char h[512];
  int fds[16];
  size_t nfds = 5;
  uint64_t off;
  assert_int_equal(nf_ipc_export(p, b, h, sizeof h, fds, 16, &nfds, &off), NF_ERR_UNSUPPORTED);
  assert_non_null(strstr(nf_last_error(), "host memory (spill)"));
  assert_int_equal(nfds, 0);
  assert_int_equal(nf_ipc_export(p, a, h, sizeof h, fds, 16, &nfds, &off), NF_OK);
  nf_handle_t x;
  assert_int_equal(be->ops->mem_import(be, fds[0], 1ull << 40, G, &x), NF_ERR_INVALID); // past the end
  assert_int_equal(be->ops->mem_import(be, fds[0], G / 2, G, &x), NF_ERR_INVALID);      // not a granule
  for (size_t i = 0; i < nfds; i++) close(fds[i]);
  nf_free(p, a);
  nf_free(p, b);
  nf_pool_destroy(p);
  nf_backend_destroy(be);

  nf_backend_t *inner = nft_host(64ull << 20, G), *fbe;
  assert_int_equal(nf_backend_fault_create(&fbe, inner, 0, 0, 1), NF_OK);
  p = nft_pool_on(fbe, NULL);
  assert_non_null(p);
  a = nf_alloc(p, 3 * G, NULL);
  assert_non_null(a);
  uint64_t calls, failed;
  nf_backend_fault_counts(fbe, &calls, &failed);
  nf_backend_fault_set(fbe, calls + 2, 0); // the second export fails
  assert_int_equal(nf_ipc_export(p, a, h, sizeof h, fds, 16, &nfds, &off), NF_ERR_BACKEND);
  assert_int_equal(nfds, 0); // the first fd was closed again
  nf_backend_fault_set(fbe, 0, 0);
  assert_int_equal(nf_ipc_export(p, a, h, sizeof h, fds, 16, &nfds, &off), NF_OK);
  void *base;
  nf_ipc_map_t *m;
  assert_int_equal(nf_ipc_import(fbe, h, &base, &m), NF_OK);
  nf_ipc_close(m);
  for (size_t i = 0; i < nfds; i++) close(fds[i]);
  nf_free(p, a);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(fbe);
}

// Open descriptors of this process.

// Room for exactly what the handle needs is enough: as many fds as mappings,
// a buffer of the handle's length plus its NUL; one fd or byte less is
// refused (a handle cut short would import part of the block), and a refused
// export leaves no fd open. Import and close leave none either (the fds
// fetched from the exporter are closed once imported).
static void test_exact_room(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool_new(&be);
  void *b = nf_alloc(p, 3 * G, NULL);
  assert_non_null(b);
  char h[512], h2[512];
  int fds[16];
  size_t nfds = 0;
  uint64_t off;
  int fds0 = nft_open_fds();
  assert_int_equal(nf_ipc_export(p, b, h, sizeof h, fds, 16, &nfds, &off), NF_OK);
  size_t k = nfds, len = strlen(h);
  assert_true(k >= 3);
  for (size_t i = 0; i < nfds; i++) close(fds[i]);
  assert_int_equal(nf_ipc_export(p, b, h2, sizeof h2, fds, k - 1, &nfds, &off), NF_ERR_INVALID);
  assert_non_null(strstr(nf_last_error(), "room for"));
  assert_int_equal(nf_ipc_export(p, b, h2, len, fds, k, &nfds, &off), NF_ERR_INVALID); // no room for the NUL
  assert_non_null(strstr(nf_last_error(), "too small"));
  assert_int_equal(nfds, 0);
  assert_int_equal(nft_open_fds(), fds0); // the refused export's fds were closed
  assert_int_equal(nf_ipc_export(p, b, h2, len + 1, fds, k, &nfds, &off), NF_OK);
  assert_int_equal(nfds, k);
  assert_string_equal(h2, h); // the same fds again: the same handle
  int fds1 = nft_open_fds();
  void *base;
  nf_ipc_map_t *m;
  assert_int_equal(nf_ipc_import(be, h2, &base, &m), NF_OK);
  nf_ipc_close(m);
  assert_int_equal(nft_open_fds(), fds1);
  for (size_t i = 0; i < nfds; i++) close(fds[i]);
  nf_free(p, b);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// Handles that parse but cannot be right are refused before anything is
// fetched or mapped: a granule that is not a power of two, no granules, a
// mapping longer than the handle's granules.
static void test_bad_handles(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool_new(&be);
  void *b = nf_alloc(p, G, NULL);
  assert_non_null(b);
  char h[256], bad[256];
  int fds[4];
  size_t nfds = 0;
  uint64_t off;
  assert_int_equal(nf_ipc_export(p, b, h, sizeof h, fds, 4, &nfds, &off), NF_OK);
  assert_int_equal(nfds, 1);
  int fd;
  unsigned long long foff;
  assert_int_equal(sscanf(strrchr(h, ' ') + 1, "%d:%llu", &fd, &foff), 2);
  void *base = (void *)1;
  nf_ipc_map_t *m = (nf_ipc_map_t *)1;
  snprintf(bad, sizeof bad, "nofrag-ipc1 %d %d 1 %d:%llu", (int)getpid(), 3 * G, fd, foff);
  assert_int_equal(nf_ipc_import(be, bad, &base, &m), NF_ERR_INVALID);
  assert_non_null(strstr(nf_last_error(), "not a nofrag handle"));
  assert_null(m);
  snprintf(bad, sizeof bad, "nofrag-ipc1 %d %d 0", (int)getpid(), G);
  assert_int_equal(nf_ipc_import(be, bad, &base, &m), NF_ERR_INVALID);
  assert_non_null(strstr(nf_last_error(), "not a nofrag handle"));
  snprintf(bad, sizeof bad, "nofrag-ipc1 %d %d 1 %d:%llu:2", (int)getpid(), G, fd, foff);
  assert_int_equal(nf_ipc_import(be, bad, &base, &m), NF_ERR_INVALID);
  assert_non_null(strstr(nf_last_error(), "bad mapping size"));
  assert_null(m);
  close(fd);
  nf_free(p, b);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A block that starts inside a mapping unit (units:N) shares the whole unit:
// the handle starts at the unit's first granule and the offset points into
// it, so the importer sees the block's bytes at base + offset.
static void test_block_inside_unit(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 64ull << 20, G, "units:16,small_max:4KiB");
  assert_non_null(p);
  void *a = nf_alloc(p, 40 * G, NULL); // grows by units: two of 16 granules, then single ones
  assert_non_null(a);
  assert_int_equal(nf_free(p, a), NF_OK);
  void *pad = nf_alloc(p, 3 * G, NULL), *b = nf_alloc(p, 5 * G, NULL); // both in the first unit
  assert_true(pad && b);
  assert_ptr_equal(pad, a);
  assert_ptr_equal(b, (char *)a + 3 * G);
  nft_fill(b, 5 * G, 31);
  char h[512];
  int fds[16];
  size_t nfds = 0;
  uint64_t off;
  assert_int_equal(nf_ipc_export(p, b, h, sizeof h, fds, 16, &nfds, &off), NF_OK);
  assert_int_equal(off, 3 * G); // the handle starts at the unit's first granule, where pad lies
  void *base;
  nf_ipc_map_t *m;
  if (nf_ipc_import(be, h, &base, &m) != NF_OK) fail_msg("import '%s': %s", h, nf_last_error());
  assert_true(nft_check((char *)base + off, 5 * G, 31));
  nf_ipc_close(m);
  for (size_t i = 0; i < nfds; i++) close(fds[i]);
  nf_free(p, b);
  nf_free(p, pad);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// An import whose second mapping fails unmaps what it mapped (the first
// mapping only) and releases everything: the backend holds what it held
// before the import.
static void test_import_map_fails(void **state) {
  (void)state;
  nf_backend_t *inner = nft_host(64ull << 20, G), *fbe;
  assert_int_equal(nf_backend_fault_create(&fbe, inner, 0, 0, 1), NF_OK);
  nf_pool_t *p = nft_pool_on(fbe, NULL);
  assert_non_null(p);
  void *a = nf_alloc(p, 3 * G, NULL);
  assert_non_null(a);
  char h[512];
  int fds[16];
  size_t nfds = 0;
  uint64_t off;
  assert_int_equal(nf_ipc_export(p, a, h, sizeof h, fds, 16, &nfds, &off), NF_OK);
  assert_int_equal(nfds, 3);
  uint64_t g0, m0, g1, m1, calls, failed;
  nf_backend_host_usage(inner, &g0, &m0);
  nf_backend_fault_counts(fbe, &calls, &failed);
  nf_backend_fault_set(fbe, calls + 6, 0); // 3 imports, the reservation, a map, then this map fails
  void *base;
  nf_ipc_map_t *m;
  assert_int_equal(nf_ipc_import(fbe, h, &base, &m), NF_ERR_BACKEND);
  assert_non_null(strstr(nf_last_error(), "map failed"));
  nf_backend_fault_set(fbe, 0, 0);
  nf_backend_host_usage(inner, &g1, &m1);
  assert_int_equal(g1, g0);
  assert_int_equal(m1, m0);
  for (size_t i = 0; i < nfds; i++) close(fds[i]);
  nf_free(p, a);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(fbe);
}

// A block whose memory is not all mapped (offloaded to disk) cannot be
// shared: the export says so and hands back no fd; back on the device, it can.
static void test_offloaded_not_exported(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool_new(&be);
  void *b = nf_alloc(p, 4 * G, NULL);
  assert_non_null(b);
  assert_int_equal(nf_offload(p, b, NULL, NF_TIER_DISK), NF_OK);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  char h[512];
  int fds[16];
  size_t nfds = 7;
  uint64_t off;
  assert_int_equal(nf_ipc_export(p, b, h, sizeof h, fds, 16, &nfds, &off), NF_ERR_INVALID);
  assert_non_null(strstr(nf_last_error(), "not resident"));
  assert_int_equal(nfds, 0);
  assert_int_equal(nf_prefetch(p, b, NULL), NF_OK);
  assert_int_equal(nf_ipc_export(p, b, h, sizeof h, fds, 16, &nfds, &off), NF_OK);
  for (size_t i = 0; i < nfds; i++) close(fds[i]);
  nf_free(p, b);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ipc_refusals),
      cmocka_unit_test(test_shared_block_stays),
      cmocka_unit_test(test_share_with_child),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_exact_room),
      cmocka_unit_test(test_bad_handles),
      cmocka_unit_test(test_block_inside_unit),
      cmocka_unit_test(test_import_map_fails),
      cmocka_unit_test(test_offloaded_not_exported),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

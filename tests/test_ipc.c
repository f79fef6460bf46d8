// Sharing a block with another process (src/torch/ipc.c, PyTorch's CUDA IPC
// under the adapter), on the host backend: a child exports a live block, the
// parent imports it (pidfd_getfd), both see each other's writes, and closing
// the import leaves nothing mapped; bad handles give clear errors.
#include "nf_test.h"

#include "torch/torch.h"

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ipc_refusals),
      cmocka_unit_test(test_shared_block_stays),
      cmocka_unit_test(test_share_with_child),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

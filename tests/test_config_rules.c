// Configuration rules beyond test_config.c's parser tests (src/core/config.c):
// every key lands in its own field, each bounded key refuses one past its
// maximum (in a string and in a struct filled by hand), and a quoted token is
// cut only when it is longer than the quote limit.
#include "nf_test.h"

#define def nft_conf_default
#define ok nft_conf_ok
#define bad(s, needle) nft_conf_bad(s, needle, NULL)

// release_after and tight had no test of their own: release_after must land
// in release_after (not the neighbouring count), tight takes 0 or 1 only.
static void test_counts_land_in_their_fields(void **state) {
  (void)state;
  nf_config_t c = ok("release_after:7");
  assert_int_equal(c.release_after, 7);
  assert_int_equal(c.release_idle_ms, def().release_idle_ms);
  c = ok("release_after:1073741824"); // 2^30, the maximum
  assert_int_equal(c.release_after, 1u << 30);
  bad("release_after:1073741825", "out of range");
  c = ok("release_idle_ms:9");
  assert_int_equal(c.release_idle_ms, 9);
  assert_int_equal(c.release_after, def().release_after);
  assert_int_equal(ok("tight:1").tight, 1);
  assert_int_equal(ok("tight:1,tight:0").tight, 0);
  bad("tight:2", "tight: '2' is out of range 0..1");
}

// A struct filled by hand skips the parser: pool creation checks the same
// bounds, and one past each count's maximum is refused, the key named.
static void test_hand_filled_counts_bounded(void **state) {
  (void)state;
  static const struct {
    const char *key;
    size_t off;
    uint64_t max;
  } N[] = {
      {"units", offsetof(nf_config_t, units), 1024},
      {"views", offsetof(nf_config_t, views), 1u << 24},
      {"release_after", offsetof(nf_config_t, release_after), 1u << 30},
      {"release_idle_ms", offsetof(nf_config_t, release_idle_ms), 1u << 30},
  };
  for (size_t i = 0; i < sizeof N / sizeof N[0]; i++) {
    nf_backend_t *be = nft_host(64 * NF_MiB, 64 * 1024);
    nf_config_t c = def();
    uint64_t v = N[i].max + 1;
    memcpy((char *)&c + N[i].off, &v, sizeof v);
    nf_pool_t *p = NULL;
    nf_status_t st = nf_pool_create(&p, be, &c);
    if (st != NF_ERR_CONFIG) fail_msg("%s = %llu: pool creation returned %d", N[i].key, (unsigned long long)v, (int)st);
    assert_null(p);
    char want[64];
    snprintf(want, sizeof want, "%s %llu exceeds the maximum", N[i].key, (unsigned long long)v);
    nft_last_error_has(want);
    nf_backend_destroy(be);
  }
}

// Messages quote at most 48 bytes of input: a token of exactly 48 is quoted
// whole, one of 49 is cut with "...".
static void test_quote_limit(void **state) {
  (void)state;
  char s[80], want[80];
  memset(s, 'k', 48);
  memcpy(s + 48, ":1", 3);
  snprintf(want, sizeof want, "unknown key '%.48s' (", s);
  bad(s, want);
  memset(s, 'k', 49);
  memcpy(s + 49, ":1", 3);
  snprintf(want, sizeof want, "unknown key '%.48s...' (", s);
  bad(s, want);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_counts_land_in_their_fields),
      cmocka_unit_test(test_hand_filled_counts_bounded),
      cmocka_unit_test(test_quote_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

// Tests for the configuration parser/formatter (src/config.c).
// Self-contained: needs only config.c, so it runs even before the pool links.
#include "nf_test.h"

// Sentinels for release_threshold (NF_RELEASE_NEVER/AUTO in src/internal.h).
#define RT_NEVER UINT64_MAX
#define RT_AUTO (UINT64_MAX - 1)

#define def nft_conf_default
#define ok nft_conf_ok
#define bad nft_conf_bad

static void test_defaults(void **state) {
  nf_config_t c;
  memset(&c, 0xAB, sizeof c);
  assert_int_equal(nf_config_default(&c), NF_OK);
  assert_int_equal(c.limit, 0);
  assert_int_equal(c.reserve, 0);
  assert_true(c.release_threshold == RT_AUTO);
  assert_int_equal(c.retain, 0);
  assert_int_equal(c.granule, 0);
  assert_int_equal(c.small_max, NF_MiB);
  assert_int_equal(c.va_chunk, 0);
  assert_int_equal(c.device, 0);
  assert_int_equal(c.backend, NF_BACKEND_HOST);
  assert_int_equal(c.host_capacity, 0);
  assert_int_equal(c.views, 16384);
  assert_int_equal(nf_config_default(NULL), NF_ERR_INVALID);
}

static void test_each_key(void **state) {
  nf_config_t c;
  c = ok("limit:40GiB");
  assert_true(c.limit == 40 * NF_GiB);
  c = ok("reserve:8GiB");
  assert_true(c.reserve == 8 * NF_GiB);
  c = ok("release_threshold:512MiB");
  assert_true(c.release_threshold == 512 * NF_MiB);
  c = ok("retain:3MiB");
  assert_true(c.retain == 3 * NF_MiB);
  c = ok("granule:2MiB");
  assert_true(c.granule == 2 * NF_MiB);
  c = ok("small_max:64KiB");
  assert_true(c.small_max == 64 * NF_KiB);
  c = ok("va_chunk:1TiB");
  assert_true(c.va_chunk == 1024 * NF_GiB);
  c = ok("device:7");
  assert_int_equal(c.device, 7);
  c = ok("backend:cuda");
  assert_int_equal(c.backend, NF_BACKEND_CUDA);
  c = ok("backend:host");
  assert_int_equal(c.backend, NF_BACKEND_HOST);
  c = ok("backend:CUDA");
  assert_int_equal(c.backend, NF_BACKEND_CUDA);
  c = ok("host_capacity:141GiB");
  assert_true(c.host_capacity == 141 * NF_GiB);
  c = ok("views:0");
  assert_int_equal(c.views, 0);
  c = ok("views:100");
  assert_int_equal(c.views, 100);
  assert_int_equal(def().release_idle_ms, 10000);
  c = ok("release_idle_ms:0");
  assert_int_equal(c.release_idle_ms, 0);
  c = ok("release_idle_ms:250");
  assert_int_equal(c.release_idle_ms, 250);
  assert_int_equal(def().units, 0); // off by default (docs/design.md, "Units")
  c = ok("units:16");
  assert_int_equal(c.units, 16);
  bad("units:2000", "units", "1024");
  bad("units:-1", "units", NULL);
  assert_int_equal(def().edges, 1); // on by default (docs/design.md, "Edge sharing")
  c = ok("edges:0");
  assert_int_equal(c.edges, 0);
  bad("edges:2", "edges", NULL);

  // Several keys at once; whitespace around every token; later keys win.
  c = ok("  limit : 1GiB ,\treserve:2MiB,  device : 3 ,limit:2GiB\n");
  assert_true(c.limit == 2 * NF_GiB);
  assert_true(c.reserve == 2 * NF_MiB);
  assert_int_equal(c.device, 3);
  // Keys not mentioned keep their values.
  assert_true(c.release_threshold == RT_AUTO);
  assert_true(c.small_max == NF_MiB);

  // Edge values.
  c = ok("limit:0,granule:0,small_max:0,device:0");
  assert_int_equal(c.limit, 0);
  c = ok("granule:4096,small_max:64MiB,device:1023");
  assert_int_equal(c.granule, 4096);
  assert_true(c.small_max == 64 * NF_MiB);
  assert_int_equal(c.device, 1023);
  c = ok("granule:1GiB,device:0007");
  assert_true(c.granule == NF_GiB);
  assert_int_equal(c.device, 7);
  c = ok("limit:1125899906842624"); // 1 PiB, the largest size a key takes
  assert_true(c.limit == (uint64_t)1 << 50);
}

// Every byte-size key is bounded (1 PiB), the key and the maximum named:
// va_chunk:2^63 made nf__chunk_new calloc exabytes (an ASan abort), and
// limit:2^64-1 or reserve:999TiB gave errors about other things.
// reserve above the pool's limit (given, or the backend's capacity) names the
// key and both sizes (reserve:999TiB reported "limit 0" through the replay).
static void test_reserve_above_limit(void **state) {
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create_from_string(&p, "backend:host,limit:4MiB,reserve:8MiB"), NF_ERR_CONFIG);
  assert_null(p);
  const char *m = nf_last_error();
  if (!strstr(m, "nofrag: reserve 8.000 MiB (8388608 B) exceeds the pool's limit 4.000 MiB (4194304 B"))
    fail_msg("'%s'", m);
  assert_int_equal(nf_pool_create_from_string(&p, "backend:host,host_capacity:1GiB,reserve:999TiB"), NF_ERR_CONFIG);
  m = nf_last_error();
  if (!strstr(m, "reserve 999.000 TiB") || !strstr(m, "limit 1.000 GiB") || !strstr(m, "backend's capacity"))
    fail_msg("'%s'", m);
}

// The host backend's own bounds come back in the configuration's terms: the
// key at fault, NF_ERR_CONFIG (they were NF_ERR_INVALID from the backend,
// naming no key). An address range too large to reserve names va_chunk,
// the key that sized it (where the machine's address space refuses 1 PiB).
static void test_host_backend_keys(void **state) {
  (void)state;
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create_from_string(&p, "backend:host,host_capacity:1MiB"), NF_ERR_CONFIG);
  assert_null(p);
  if (!strstr(nf_last_error(), "host_capacity 1048576 B is below one granule (2097152 B)")) fail_msg("'%s'", nf_last_error());
  assert_int_equal(nf_pool_create_from_string(&p, "backend:host,granule:256GiB"), NF_ERR_CONFIG);
  if (!strstr(nf_last_error(), "the default host_capacity") || !strstr(nf_last_error(), "set granule smaller"))
    fail_msg("'%s'", nf_last_error());
  assert_int_equal(nf_pool_create_from_string(&p, "backend:host,limit:64MiB,va_chunk:1PiB"), NF_OK);
  void *x = nf_alloc(p, 4096, NULL);
  if (!x && !strstr(nf_last_error(), "set a smaller va_chunk")) fail_msg("'%s'", nf_last_error());
  if (x) assert_int_equal(nf_free(p, x), NF_OK);
  nf_pool_destroy(p);
}

static void test_size_bounds(void **state) {
  static const char *const keys[] = {"limit", "reserve", "release_threshold", "retain", "granule", "small_max",
                                     "va_chunk", "host_capacity", "trace_max", "spill_limit", "spill_reserve"};
  char s[128], want[64];
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    snprintf(s, sizeof s, "%s:9223372036854775808", keys[i]);
    snprintf(want, sizeof want, "%s: '9223372036854775808'", keys[i]);
    bad(s, want, "exceeds the maximum of 1 PiB");
    snprintf(s, sizeof s, "%s:1125899906842625", keys[i]); // 1 PiB + 1
    bad(s, keys[i], "maximum");
  }
  bad("limit:18446744073709551615", "limit: '18446744073709551615'", "exceeds the maximum of 1 PiB");
  bad("release_threshold:18446744073709551614", "release_threshold", "1 PiB"); // was read as "auto"
  assert_true(ok("va_chunk:1024TiB").va_chunk == (uint64_t)1 << 50);
  // In range for the parser but too many granules for one range's metadata:
  // refused at pool creation, before any calloc (an ASan build aborted there).
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create_from_string(&p, "backend:host,granule:4KiB,va_chunk:1024TiB"), NF_ERR_CONFIG);
  if (!strstr(nf_last_error(), "va_chunk 1024.000 TiB is 274877906944 granules of 4096 B"))
    fail_msg("'%s'", nf_last_error());
}

static void test_release_names(void **state) {
  assert_true(ok("release_threshold:never").release_threshold == RT_NEVER);
  assert_true(ok("release_threshold:inf").release_threshold == RT_NEVER);
  assert_true(ok("release_threshold:INF").release_threshold == RT_NEVER);
  assert_true(ok("release_threshold:0").release_threshold == 0);
  nf_config_t c = ok("release_threshold:never");
  char err[128];
  assert_int_equal(nf_config_parse(&c, "release_threshold:auto", err, sizeof err), NF_OK);
  assert_true(c.release_threshold == RT_AUTO);
}

static void test_suffixes(void **state) {
  static const struct {
    const char *s;
    uint64_t v;
  } T[] = {
      {"123", 123},
      {"123B", 123},
      {"123b", 123},
      {"2K", 2000},
      {"2k", 2000},
      {"2KB", 2000},
      {"2kb", 2000},
      {"2KiB", 2048},
      {"2kib", 2048},
      {"2KIB", 2048},
      {"3M", 3000000},
      {"3MB", 3000000},
      {"3MiB", 3 * NF_MiB},
      {"3mib", 3 * NF_MiB},
      {"4G", 4000000000ull},
      {"4GB", 4000000000ull},
      {"4GiB", 4 * NF_GiB},
      {"4gib", 4 * NF_GiB},
      {"5T", 5000000000000ull},
      {"5TB", 5000000000000ull},
      {"5TiB", 5 * 1024 * NF_GiB},
      {"5tib", 5 * 1024 * NF_GiB},
      {"40 GiB", 40 * NF_GiB},
      {"0GiB", 0},
      {"1024TiB", 1024ull << 40}, // 1 PiB: the largest a size key takes
  };
  char buf[64];
  for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
    snprintf(buf, sizeof buf, "limit:%s", T[i].s);
    nf_config_t c = ok(buf);
    if (c.limit != T[i].v) fail_msg("'%s' -> %llu, expected %llu", buf, (unsigned long long)c.limit,
                                    (unsigned long long)T[i].v);
  }
}

static void test_decimals(void **state) {
  assert_true(ok("limit:1.5GiB").limit == 3 * NF_GiB / 2);
  assert_true(ok("limit:0.5MiB").limit == NF_MiB / 2);
  assert_true(ok("limit:1.25GB").limit == 1250000000ull);
  assert_true(ok("limit:2.0").limit == 2);
  assert_true(ok("limit:1.1GiB").limit == 1181116006ull); // 1181116006.4 rounds down
  assert_true(ok("limit:0.001KiB").limit == 1);           // 1.024 -> 1
  assert_true(ok("limit:1.123456789GB").limit == 1123456789ull);
  assert_true(ok("limit:1.500000000000000GiB").limit == 3 * NF_GiB / 2); // trailing zeros ok
  assert_true(ok("limit:15.999999999TiB").limit == 17592186043316ull); // floor(15.999999999*2^40)
  assert_true(ok("limit:1023.999999999TiB").limit == 1125899906841524ull); // floor(1023.999999999*2^40)
  bad("limit:16777215.999999999TiB", "exceeds the maximum of 1 PiB", NULL); // 18446744073709550516
  assert_true(ok("release_threshold:0.5GiB").release_threshold == NF_GiB / 2);
}

static void test_errors(void **state) {
  // Structure.
  bad(",", "empty item", NULL);
  bad("limit:1GiB,,reserve:1GiB", "empty item", NULL);
  bad("limit:1GiB,", "empty item", NULL);
  bad(",limit:1GiB", "empty item", NULL);
  bad("limit", "no ':'", "limit");
  bad("limit=4GiB", "no ':'", "limit=4GiB");
  bad(":4GiB", "empty key", NULL);
  bad("limit:1GiB, reserve 2GiB", "no ':'", "reserve 2GiB");

  // Unknown keys: name the key and list the valid ones.
  bad("limt:1GiB", "unknown key 'limt'", "limit, reserve, release_threshold, retain, granule, "
                                         "small_max, va_chunk, device, backend, host_capacity");
  bad("LIMIT:1GiB", "unknown key 'LIMIT'", "valid keys");
  // Bytes outside printable ASCII read as \xNN: a non-ASCII and a control
  // character were both '?' (a UTF-8 key read '??').
  bad("limit\xc3\xa9:1GiB", "unknown key 'limit\\xc3\\xa9'", NULL);
  bad("lim\x01it:1GiB", "unknown key 'lim\\x01it'", NULL);
  bad("limit:1GiB,bogus:3", "'bogus'", NULL);

  // Values.
  bad("limit:", "limit: empty value", NULL);
  bad("limit:   ", "empty value", NULL);
  bad("device:", "device: empty value", NULL);
  bad("backend:", "backend: empty value", NULL);
  bad("limit:-1", "negative", "limit");
  bad("reserve:-1GiB", "negative", "reserve");
  bad("device:-1", "negative", "device");
  bad("views:-1", "negative", "views");
  bad("views:many", "views", "many");
  bad("views:99999999", "views", NULL);
  bad("release_idle_ms:-5", "negative", "release_idle_ms");
  bad("release_idle_ms:10s", "release_idle_ms", "10s");
  bad("release_idle_ms:9999999999", "release_idle_ms", NULL);
  bad("limit:18446744073709551616", "overflows", NULL);
  bad("limit:99999999999999999999999", "overflows", NULL);
  bad("limit:16777216TiB", "overflows", NULL);
  bad("limit:16777215.9999999999TiB", "decimal places", NULL);
  bad("limit:18446744073.709551616GB", "overflows", NULL); // via the fraction
  bad("limit:18446744073.709551615GB", "(18446744073709551615 B) exceeds", NULL); // exact, then bounded
  bad("limit:18446744073709551615.5", "(18446744073709551615 B) exceeds", NULL);
  bad("limit:40XB", "unknown size suffix 'XB'", NULL);
  bad("limit:40PiB", "exceeds the maximum of 1 PiB", NULL); // a suffix now: the bound is stated in it
  bad("limit:40EiB", "unknown size suffix 'EiB'", NULL);
  assert_true(ok("limit:1PiB").limit == 1ull << 50 && ok("limit:1PB").limit == 1000000000000000ull);
  bad("limit:40GiBs", "unknown size suffix", NULL);
  bad("limit:90%", "percentages are not supported", NULL);
  bad("limit:40GiB junk", "unexpected characters", NULL);
  bad("limit:40GiB!", "unexpected characters", NULL);
  bad("limit:4 0", "unexpected characters", NULL);
  bad("limit:1:2", "unexpected characters", NULL);
  bad("limit:0x10", "unexpected characters", NULL); // no hex
  bad("limit:GiB", "not a size", NULL);
  bad("limit:+5", "not a size", NULL);
  bad("limit:.5GiB", "not a size", NULL);
  bad("limit:1.GiB", "digit after '.'", NULL);
  bad("limit:1.5.5", "unexpected characters", NULL);
  bad("limit:never", "not a size", NULL);
  bad("release_threshold:sometimes", "not a size", NULL);
  bad("granule:3000", "power of two", NULL);
  bad("granule:2048", "power of two", NULL);
  bad("granule:3MiB", "power of two", NULL);
  bad("small_max:65MiB", "64MiB", NULL);
  bad("small_max:64.000001MiB", "64MiB", NULL);
  bad("device:1024", "out of range", NULL);
  bad("device:99999999999999999999", "out of range", NULL);
  bad("device:1.5", "not an integer", NULL);
  bad("device:1GiB", "not an integer", NULL);
  bad("backend:rocm", "unknown backend 'rocm'", "host or cuda");

  // A valid prefix must not be applied when a later item fails.
  bad("limit:1GiB,reserve:2GiB,oops:1", "oops", NULL);
}

static void test_null_and_empty(void **state) {
  nf_config_t c = def(), before = c;
  char err[64] = "stale";
  assert_int_equal(nf_config_parse(&c, NULL, err, sizeof err), NF_OK);
  assert_string_equal(err, "");
  assert_int_equal(nf_config_parse(&c, "", err, sizeof err), NF_OK);
  assert_int_equal(nf_config_parse(&c, "  \t\n ", NULL, 0), NF_OK);
  assert_memory_equal(&c, &before, sizeof c);
  // NULL err with an error: no crash, still reported.
  assert_int_equal(nf_config_parse(&c, "nope", NULL, 0), NF_ERR_CONFIG);
  assert_int_equal(nf_config_parse(&c, "nope", NULL, 100), NF_ERR_CONFIG);
  assert_memory_equal(&c, &before, sizeof c);
  // NULL cfg is an argument error.
  assert_int_equal(nf_config_parse(NULL, "limit:1", err, sizeof err), NF_ERR_INVALID);
  assert_true(strlen(err) > 0);
}

static void test_small_err_buffers(void **state) {
  nf_config_t c = def();
  // errlen 0: the buffer must not be touched at all.
  char guard[4] = {'A', 'B', 'C', 'D'};
  assert_int_equal(nf_config_parse(&c, "bogus:1", guard, 0), NF_ERR_CONFIG);
  assert_memory_equal(guard, "ABCD", 4);
  // errlen 1: only the terminator.
  assert_int_equal(nf_config_parse(&c, "bogus:1", guard, 1), NF_ERR_CONFIG);
  assert_int_equal(guard[0], '\0');
  assert_memory_equal(guard + 1, "BCD", 3);
  // errlen 3: truncated, terminated, nothing past it.
  memcpy(guard, "ABCD", 4);
  assert_int_equal(nf_config_parse(&c, "bogus:1", guard, 3), NF_ERR_CONFIG);
  assert_int_equal(guard[2], '\0');
  assert_int_equal(guard[3], 'D');
  // A heap buffer of exact size lets ASan catch any overrun.
  for (size_t n = 1; n < 200; n += 7) {
    char *e = malloc(n);
    assert_non_null(e);
    assert_int_equal(nf_config_parse(&c, "limit:1GiB,unknown_key_here:12", e, n), NF_ERR_CONFIG);
    assert_true(strlen(e) < n);
    free(e);
  }
}

static void test_long_garbage(void **state) {
  size_t n = 1 << 20;
  char *s = malloc(n + 1);
  assert_non_null(s);
  char err[256];
  nf_config_t c = def(), before = c;

  // A megabyte-long key: error message quotes only a bounded prefix.
  memset(s, 'k', n);
  memcpy(s + n - 2, ":1", 2);
  s[n] = '\0';
  assert_int_equal(nf_config_parse(&c, s, err, sizeof err), NF_ERR_CONFIG);
  assert_non_null(strstr(err, "unknown key 'kkkk"));
  assert_non_null(strstr(err, "..."));
  assert_true(strlen(err) < sizeof err);

  // A megabyte of digits overflows.
  memcpy(s, "limit:", 6);
  memset(s + 6, '9', n - 6);
  assert_int_equal(nf_config_parse(&c, s, err, sizeof err), NF_ERR_CONFIG);
  assert_non_null(strstr(err, "overflows"));

  // Many valid items are fine (and the last one wins).
  size_t off = 0;
  while (off + 32 < n) off += (size_t)sprintf(s + off, "limit:%zu,", off);
  off += (size_t)sprintf(s + off, "limit:7");
  assert_int_equal(nf_config_parse(&c, s, err, sizeof err), NF_OK);
  assert_int_equal(c.limit, 7);
  c = before;

  // Random bytes (control chars, high bytes) never crash; messages stay
  // printable ASCII.
  uint64_t seed = nft_env_seed(12345);
  for (int round = 0; round < 2000; round++) {
    size_t len = (size_t)(nft_rand(&seed) % 64);
    for (size_t i = 0; i < len; i++) {
      uint64_t r = nft_rand(&seed);
      // Bias towards the grammar's characters so that deep paths are hit.
      static const char alpha[] = "limt:,.0123456789 GiBKMTkmgb%-_abcdefhnorsuvx";
      s[i] = (r & 1) ? alpha[(r >> 8) % (sizeof alpha - 1)] : (char)(1 + (r >> 8) % 255);
    }
    s[len] = '\0';
    nf_config_t x = def(), x0 = x;
    nf_status_t st = nf_config_parse(&x, s, err, sizeof err);
    if (st != NF_OK) {
      assert_int_equal(st, NF_ERR_CONFIG);
      assert_memory_equal(&x, &x0, sizeof x);
      for (const char *p = err; *p; p++) assert_true(*p >= 0x20 && *p < 0x7f);
    }
  }
  free(s);
}

static void roundtrip(const nf_config_t *c) {
  char buf[512], err[256];
  int n = nf_config_format(c, buf, sizeof buf);
  assert_true(n > 0 && (size_t)n < sizeof buf);
  assert_int_equal((size_t)n, strlen(buf));
  nf_config_t d;
  memset(&d, 0x5A, sizeof d); // parse must overwrite every field it formats
  nf_config_default(&d);
  d.limit = 999, d.device = 9, d.backend = 1 - c->backend;
  if (nf_config_parse(&d, buf, err, sizeof err) != NF_OK) fail_msg("'%s': %s", buf, err);
  assert_memory_equal(c, &d, sizeof d);
}

static void test_format_roundtrip(void **state) {
  nf_config_t c = def();
  roundtrip(&c);
  char buf[512];
  nf_config_format(&c, buf, sizeof buf);
  assert_non_null(strstr(buf, "release_threshold:auto"));
  assert_non_null(strstr(buf, "backend:host"));

  c = ok("limit:40GiB,reserve:8GiB,release_threshold:never,retain:1.5GiB,granule:2MiB,"
         "small_max:512KiB,va_chunk:1TiB,device:3,backend:cuda,host_capacity:141GiB");
  roundtrip(&c);
  nf_config_format(&c, buf, sizeof buf);
  assert_non_null(strstr(buf, "release_threshold:never"));
  assert_non_null(strstr(buf, "limit:42949672960"));

  c = def();
  c.limit = c.reserve = c.retain = c.va_chunk = c.host_capacity = (uint64_t)1 << 50; // the maximum
  c.release_threshold = (uint64_t)1 << 50;
  c.device = 1023;
  roundtrip(&c);

  // Random valid configs.
  uint64_t seed = nft_env_seed(777);
  for (int i = 0; i < 1000; i++) {
    c = def();
    c.limit = nft_rand(&seed) >> (14 + nft_rand(&seed) % 50); // <= 1 PiB, every key's maximum
    c.reserve = nft_rand(&seed) >> (14 + nft_rand(&seed) % 50);
    c.release_threshold = nft_rand(&seed) % 3 ? nft_rand(&seed) >> 14 : RT_NEVER - nft_rand(&seed) % 2;
    c.retain = nft_rand(&seed) % 3 ? nft_rand(&seed) >> 20 : 0;
    c.granule = (nft_rand(&seed) % 2) ? (uint64_t)4096 << (nft_rand(&seed) % 20) : 0;
    c.small_max = nft_rand(&seed) % (64 * NF_MiB + 1);
    c.va_chunk = nft_rand(&seed) >> 14;
    c.device = (int)(nft_rand(&seed) % 1024);
    c.backend = (int)(nft_rand(&seed) % 2);
    c.host_capacity = nft_rand(&seed) >> 14;
    c.views = nft_rand(&seed) % (1u << 24);
    c.release_idle_ms = nft_rand(&seed) % (1u << 30);
    roundtrip(&c);
  }
}

static void test_trace_keys(void **state) {
  nf_config_t c = def();
  assert_int_equal(c.trace[0], 0);
  assert_int_equal(c.trace_max, 256 * NF_MiB);
  c = ok("trace:/tmp/job.csv,trace_max:1MiB");
  assert_string_equal(c.trace, "/tmp/job.csv");
  assert_int_equal(c.trace_max, NF_MiB);
  c = ok(" trace :  /a b/c:d.csv  ,limit:1GiB"); // trimmed; ':' and spaces inside the path kept
  assert_string_equal(c.trace, "/a b/c:d.csv");
  c = ok("trace:/x/long-name.csv,trace:/y.csv"); // the last wins, zero-filled behind it
  assert_string_equal(c.trace, "/y.csv");
  for (size_t i = strlen("/y.csv"); i < sizeof c.trace; i++) assert_int_equal(c.trace[i], 0);
  c = ok("trace:/y.csv,trace:"); // empty: off
  assert_int_equal(c.trace[0], 0);
  c = ok("trace_max:0");
  assert_int_equal(c.trace_max, 0);
  char longp[NF_TRACE_PATH_MAX + 16];
  memset(longp, 'p', sizeof longp);
  snprintf(longp, sizeof longp, "trace:/");
  longp[7] = 'p';
  longp[6 + NF_TRACE_PATH_MAX - 1] = '\0'; // path of NF_TRACE_PATH_MAX - 1 bytes: fits
  c = ok(longp);
  assert_int_equal(strlen(c.trace), NF_TRACE_PATH_MAX - 1);
  memset(longp, 'p', sizeof longp);
  memcpy(longp, "trace:/", 7);
  longp[6 + NF_TRACE_PATH_MAX] = '\0'; // one more: too long
  bad(longp, "trace: path", "longer than the maximum of 255");
  bad("trace_max:-1", "trace_max", "negative");
  bad("trace_max:lots", "trace_max", NULL);
  bad("limit:1GiB,trace:/ok.csv,trace_max:5%", "trace_max", "percentages");
  // Round trip, with and without a path.
  c = ok("trace:/tmp/t.csv,trace_max:12345");
  roundtrip(&c);
  char buf[512];
  nf_config_format(&c, buf, sizeof buf);
  assert_non_null(strstr(buf, ",trace_max:12345,"));
  assert_non_null(strstr(buf, ",trace:/tmp/t.csv"));
  c = def();
  nf_config_format(&c, buf, sizeof buf);
  assert_null(strstr(buf, "trace:"));
  assert_non_null(strstr(buf, "trace_max:268435456"));
}

static void test_spill_keys(void **state) {
  (void)state;
  nf_config_t c = def();
  assert_int_equal(c.spill, 0);
  assert_int_equal(c.spill_limit, 0);
  assert_string_equal(c.offload_dir, "");
  c = ok("spill:host,spill_limit:64GiB,spill_reserve:8GiB,offload_dir:/var/tmp/nf");
  assert_int_equal(c.spill, 1);
  assert_true(c.spill_limit == 64 * NF_GiB && c.spill_reserve == 8 * NF_GiB);
  assert_string_equal(c.offload_dir, "/var/tmp/nf");
  roundtrip(&c);
  c = ok("spill:host,spill:off");
  assert_int_equal(c.spill, 0);
  bad("spill:disk", "spill", "use host or off");
  bad("spill:", "spill", NULL);
  bad("spill_limit:-3GiB", "spill_limit", "negative");
  char longp[NF_TRACE_PATH_MAX + 32];
  memset(longp, 'p', sizeof longp);
  memcpy(longp, "offload_dir:/", 13);
  longp[12 + NF_TRACE_PATH_MAX] = '\0';
  bad(longp, "offload_dir: path", "longer than the maximum of 255");
}

static void test_format_buffers(void **state) {
  nf_config_t c = def();
  char full[512];
  int n = nf_config_format(&c, full, sizeof full);
  assert_true(n > 0);
  // snprintf semantics: the return value is the full length whatever the size.
  assert_int_equal(nf_config_format(&c, NULL, 0), n);
  char small[8];
  memset(small, 'Z', sizeof small);
  assert_int_equal(nf_config_format(&c, small, 5), n);
  assert_int_equal(small[4], '\0');
  assert_memory_equal(small, full, 4);
  assert_int_equal(small[5], 'Z');
  assert_int_equal(nf_config_format(&c, small, 1), n);
  assert_int_equal(small[0], '\0');
  small[0] = 'Q';
  assert_int_equal(nf_config_format(&c, small, 0), n);
  assert_int_equal(small[0], 'Q');
  // NULL cfg: empty string, length 0.
  assert_int_equal(nf_config_format(NULL, small, sizeof small), 0);
  assert_int_equal(small[0], '\0');
}

// The public byte formatter (the one nofrag's messages use).
static void test_format_bytes(void **state) {
  (void)state;
  char b[32];
  nf_format_bytes(b, sizeof b, 512);
  assert_string_equal(b, "512 B");
  nf_format_bytes(b, sizeof b, 3 * NF_MiB);
  assert_string_equal(b, "3.000 MiB");
  nf_format_bytes(b, sizeof b, 3 * NF_GiB / 2);
  assert_string_equal(b, "1.500 GiB");
  nf_format_bytes(b, sizeof b, 2 * (NF_GiB << 10));
  assert_string_equal(b, "2.000 TiB");
  nf_format_bytes(b, 4, 3 * NF_MiB); // truncated, still terminated
  assert_int_equal(strlen(b), 3);
  nf_format_bytes(NULL, 0, 1); // nothing to write to: nothing happens
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_format_bytes), cmocka_unit_test(test_defaults),       cmocka_unit_test(test_each_key),
      cmocka_unit_test(test_release_names),  cmocka_unit_test(test_suffixes),
      cmocka_unit_test(test_decimals),       cmocka_unit_test(test_errors),
      cmocka_unit_test(test_null_and_empty), cmocka_unit_test(test_small_err_buffers),
      cmocka_unit_test(test_long_garbage),   cmocka_unit_test(test_format_roundtrip),
      cmocka_unit_test(test_format_buffers), cmocka_unit_test(test_size_bounds), cmocka_unit_test(test_reserve_above_limit), cmocka_unit_test(test_host_backend_keys),
      cmocka_unit_test(test_trace_keys), cmocka_unit_test(test_spill_keys),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

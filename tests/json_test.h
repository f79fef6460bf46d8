// A small JSON reader for tests that read the library's JSON back
// (test_snapshot.c: nf_snapshot; test_walk.c). Static functions, one copy per
// test program.
#ifndef NF_JSON_TEST_H
#define NF_JSON_TEST_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// Just enough JSON for the snapshot: objects, arrays, strings without
// escapes other than \" and \\, non-negative integers, true/false/null.
// Anything else fails the parse (and the test).
enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
typedef struct jv {
  int type;
  uint64_t num;
  char *str;
  struct jv **items; // array elements or object values
  char **keys;       // object keys
  size_t n;
} jv;

static const char *jp; // parse cursor

static inline void jws(void) { while (*jp == ' ' || *jp == '\n' || *jp == '\t' || *jp == '\r') jp++; }

static inline char *jstr(void) {
  if (*jp != '"') return NULL;
  const char *s = ++jp;
  while (*jp && *jp != '"') jp += *jp == '\\' && jp[1] ? 2 : 1;
  if (*jp != '"') return NULL;
  char *o = strndup(s, (size_t)(jp - s));
  jp++;
  return o;
}

static inline void jfree(jv *v) {
  if (!v) return;
  for (size_t i = 0; i < v->n; i++) { jfree(v->items[i]); if (v->keys) free(v->keys[i]); }
  free(v->items); free(v->keys); free(v->str); free(v);
}

static inline jv *jparse(void) {
  jws();
  jv *v = calloc(1, sizeof *v);
  if (*jp == '{' || *jp == '[') {
    int obj = *jp++ == '{';
    v->type = obj ? J_OBJ : J_ARR;
    jws();
    if (*jp == (obj ? '}' : ']')) { jp++; return v; }
    for (;;) {
      v->items = realloc(v->items, (v->n + 1) * sizeof *v->items);
      if (obj) {
        v->keys = realloc(v->keys, (v->n + 1) * sizeof *v->keys);
        jws();
        char *k = jstr();
        jws();
        if (!k || *jp++ != ':') { free(k); jfree(v); return NULL; }
        v->keys[v->n] = k;
      }
      jv *e = jparse();
      if (!e) { if (obj) free(v->keys[v->n]); jfree(v); return NULL; }
      v->items[v->n++] = e;
      jws();
      if (*jp == ',') { jp++; continue; }
      if (*jp++ == (obj ? '}' : ']')) return v;
      jfree(v);
      return NULL;
    }
  }
  if (*jp == '"') { v->type = J_STR; if (!(v->str = jstr())) { free(v); return NULL; } return v; }
  if (*jp >= '0' && *jp <= '9') { v->type = J_NUM; v->num = strtoull(jp, (char **)&jp, 10); return v; }
  if (!strncmp(jp, "true", 4)) { v->type = J_BOOL; v->num = 1; jp += 4; return v; }
  if (!strncmp(jp, "false", 5)) { v->type = J_BOOL; jp += 5; return v; }
  if (!strncmp(jp, "null", 4)) { v->type = J_NULL; jp += 4; return v; }
  free(v);
  return NULL;
}

static inline jv *jdoc(const char *s) {
  jp = s;
  jv *v = jparse();
  jws();
  if (v && *jp) { jfree(v); return NULL; } // trailing garbage
  return v;
}

static inline jv *jget(const jv *o, const char *k) {
  if (!o || o->type != J_OBJ) fail_msg("not an object looking for \"%s\"", k);
  for (size_t i = 0; i < o->n; i++) if (!strcmp(o->keys[i], k)) return o->items[i];
  fail_msg("missing key \"%s\"", k);
  return NULL;
}
static inline uint64_t jnum(const jv *o, const char *k) {
  jv *v = jget(o, k);
  if (v->type != J_NUM) fail_msg("\"%s\" is not a number", k);
  return v->num;
}
static inline const char *js(const jv *o, const char *k) {
  jv *v = jget(o, k);
  if (v->type != J_STR) fail_msg("\"%s\" is not a string", k);
  return v->str;
}
static inline int jhas(const jv *o, const char *k) {
  for (size_t i = 0; i < o->n; i++) if (!strcmp(o->keys[i], k)) return 1;
  return 0;
}
static inline uint64_t jhex(const jv *o, const char *k) {
  const char *s = js(o, k);
  if (strncmp(s, "0x", 2)) fail_msg("\"%s\" = %s is not hex", k, s);
  return strtoull(s, NULL, 16);
}

#endif

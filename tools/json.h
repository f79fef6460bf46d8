// The CLI's JSON string writer, header-only so that html.c, hotspots.c and
// nofrag.c all call down into it (it lived in html.c, which hotspots.c then
// called back into).
#ifndef NFC_JSON_H
#define NFC_JSON_H

#include <stdio.h>

// Length of the well-formed UTF-8 sequence at s (1-4), or 0 if it is not one
// (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF).
static inline int nfc_utf8_len(const unsigned char *s) {
  unsigned char c = s[0];
  int n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (!n) return 0;
  unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
  if (s[1] < lo || s[1] > hi) return 0; // (a NUL ends the check too)
  for (int i = 2; i < n; i++)
    if (s[i] < 0x80 || s[i] > 0xBF) return 0;
  return n;
}

// A JSON string that is also safe inside <script> and HTML text: every JSON
// string the CLI writes goes through here (--json, --html, hotspots). Bytes
// that are not UTF-8 (a file name in another encoding) become U+FFFD, so the
// output stays valid JSON for strict readers (Python's json, browsers).
static inline void nfc_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    unsigned char c = *p;
    if (c >= 0x80) {
      int n = nfc_utf8_len(p);
      if (n) fwrite(p, 1, (size_t)n, f);
      else fputs("\\ufffd", f);
      p += n ? n : 1;
      continue;
    }
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20 || c == '<' || c == '>' || c == '&') fprintf(f, "\\u%04x", c);
    else fputc(c, f);
    p++;
  }
  fputc('"', f);
}

#endif

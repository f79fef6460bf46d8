// The CLI's JSON string writer, header-only so that html.c, hotspots.c and
// nofrag.c all call down into it (it lived in html.c, which hotspots.c then
// called back into).
#ifndef NFC_JSON_H
#define NFC_JSON_H

#include <stdio.h>

// A JSON string that is also safe inside <script> and HTML text: every JSON
// string the CLI writes goes through here (--json, --html, hotspots).
static inline void nfc_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20 || c == '<' || c == '>' || c == '&') fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

#endif

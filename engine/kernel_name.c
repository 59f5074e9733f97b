/* A demangler for the part of an Itanium C++ symbol that names a kernel: enough to tell
 * kernels apart in a report, not a full demangler (parameter types and template
 * arguments are what make symbols long, and they are dropped). */
#define _POSIX_C_SOURCE 200809L /* strnlen */
#include "engine/kernel_name.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* What a name may hold unchanged: the report writes it into JSON strings and gathers it
 * across ranks as a whitespace-separated field. */
static char safe(char c) {
    return (unsigned char)c <= ' ' || c == '"' || c == '\\' || (unsigned char)c >= 0x7f ? '_' : c;
}

/* appends text[0..len) to out, cut at n - 1 bytes in all */
static void append(char *out, size_t n, size_t *used, const char *text, size_t len) {
    for (size_t i = 0; i < len && *used + 1 < n; i++) out[(*used)++] = safe(text[i]);
    out[*used] = 0;
}

/* Parses the <source-name>s of `p` (after "_Z"): one for a plain name, the chain of a
 * nested one (N ... E), stopping at the first template argument list or anything else this
 * does not read. Returns how many components it appended. */
static int components(const char *p, char *out, size_t n, size_t *used) {
    int nested = *p == 'N', count = 0;
    if (nested) {
        p++;
        while (*p == 'r' || *p == 'V' || *p == 'K' || *p == 'R' || *p == 'O') p++;
    }
    for (;;) {
        if (*p == 'L') p++; /* internal linkage: a static function */
        const char *name = NULL;
        size_t len = 0;
        int prefix = 0; /* std::, which a name follows even outside N ... E */
        if (p[0] == 'S' && p[1] == 't') {
            name = "std", len = 3, p += 2, prefix = 1;
        } else if (isdigit((unsigned char)*p)) {
            while (isdigit((unsigned char)*p) && len < 100000) len = 10 * len + (size_t)(*p++ - '0');
            if (len == 0 || strnlen(p, len) < len) return count; /* cut short: keep what we have */
            name = p, p += len;
            if (len == 12 && strncmp(name, "_GLOBAL__N_1", 12) == 0)
                name = "(anonymous_namespace)", len = strlen(name);
        } else {
            return count;
        }
        if (count++) append(out, n, used, "::", 2);
        append(out, n, used, name, len);
        if (!prefix && (!nested || *p == 'E')) return count;
    }
}

void kernel_name(const char *symbol, char *out, size_t n) {
    if (n == 0) return;
    size_t used = 0;
    out[0] = 0;
    if (!symbol || !symbol[0]) {
        append(out, n, &used, "?", 1);
        return;
    }
    if (strncmp(symbol, "_Z", 2) == 0 && components(symbol + 2, out, n, &used) > 0) return;
    used = 0;
    append(out, n, &used, symbol, strlen(symbol));
}

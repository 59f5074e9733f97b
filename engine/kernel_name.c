/* A demangler for the part of an Itanium C++ symbol that names a kernel: enough to tell
 * kernels apart in a report, not a full demangler. It reads the function's qualified name
 * and its template arguments where they are plain (types named by a name or a builtin
 * letter, integer literals): cuBLAS's CUTLASS kernels are one template whose argument
 * names the tile shape, "cutlass::Kernel2<cutlass_80_tensorop_..._64x64_32x6_tn_align8>".
 * Parameter types are dropped; template arguments it cannot read (substitutions,
 * expressions) are dropped whole. */
#define _POSIX_C_SOURCE 200809L /* strnlen */
#include "engine/kernel_name.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* the name being built: out[n], used bytes so far */
typedef struct {
    char *out;
    size_t n, used;
} sink;

/* What a name may hold unchanged: the report writes it into JSON strings and gathers it
 * across ranks as a whitespace-separated field. */
static char safe(char c) {
    return (unsigned char)c <= ' ' || c == '"' || c == '\\' || (unsigned char)c >= 0x7f ? '_' : c;
}

/* appends text[0..len), cut at n - 1 bytes in all */
static void put(sink *o, const char *text, size_t len) {
    for (size_t i = 0; i < len && o->used + 1 < o->n; i++) o->out[o->used++] = safe(text[i]);
    o->out[o->used] = 0;
}

static void put_str(sink *o, const char *text) { put(o, text, strlen(text)); }

static const char *name_at(const char *p, sink *o, int depth);

/* <source-name>: a length and that many characters; NULL when cut short */
static const char *source_name(const char *p, sink *o) {
    size_t len = 0;
    if (!isdigit((unsigned char)*p)) return NULL;
    while (isdigit((unsigned char)*p) && len < 100000) len = 10 * len + (size_t)(*p++ - '0');
    if (len == 0 || strnlen(p, len) < len) return NULL;
    if (len == 12 && strncmp(p, "_GLOBAL__N_1", 12) == 0) put_str(o, "(anonymous_namespace)");
    else put(o, p, len);
    return p + len;
}

/* the builtin type of code c, or NULL */
static const char *builtin(char c) {
    switch (c) {
    case 'v': return "void";
    case 'b': return "bool";
    case 'c': return "char";
    case 'a': return "signed_char";
    case 'h': return "unsigned_char";
    case 's': return "short";
    case 't': return "unsigned_short";
    case 'i': return "int";
    case 'j': return "unsigned";
    case 'l': return "long";
    case 'm': return "unsigned_long";
    case 'x': return "long_long";
    case 'y': return "unsigned_long_long";
    case 'f': return "float";
    case 'd': return "double";
    default: return NULL;
    }
}

/* One template argument: an integer literal (L<type><value>E), a builtin type, or a
 * name; NULL when it is none of these */
static const char *arg_at(const char *p, sink *o, int depth) {
    if (*p == 'L') {
        if (!builtin(p[1]) || p[1] == 'v') return NULL;
        char type = p[1];
        p += 2;
        if (*p == 'n') put_str(o, "-"), p++;
        const char *v = p;
        while (isdigit((unsigned char)*p)) p++;
        if (p == v || *p != 'E') return NULL;
        if (type == 'b') put_str(o, *v == '0' ? "false" : "true");
        else put(o, v, (size_t)(p - v));
        return p + 1;
    }
    if (builtin(*p)) {
        put_str(o, builtin(*p));
        return p + 1;
    }
    return name_at(p, o, depth + 1);
}

/* <template-args> at p ('I'): "<a,b>" appended, the position after its 'E' returned; NULL
 * (and nothing appended) when an argument is not one arg_at reads */
static const char *template_args(const char *p, sink *o, int depth) {
    if (*p != 'I' || depth > 3) return NULL;
    size_t mark = o->used;
    put_str(o, "<");
    p++; /* past the 'I' */
    for (int first = 1; *p != 'E'; first = 0) {
        if (!first) put_str(o, ",");
        p = *p ? arg_at(p, o, depth) : NULL;
        if (!p) {
            o->used = mark;
            o->out[mark] = 0;
            return NULL;
        }
    }
    put_str(o, ">");
    return p + 1;
}

/* A plain or nested (N ... E) name with the template arguments of its components;
 * appends what it reads and returns the position after it, or NULL where it stops (what
 * it appended up to there stays: the kernel's name without what follows) */
static const char *name_at(const char *p, sink *o, int depth) {
    int nested = *p == 'N', count = 0;
    if (nested) {
        p++;
        while (*p == 'r' || *p == 'V' || *p == 'K' || *p == 'R' || *p == 'O') p++;
    }
    for (;;) {
        if (*p == 'L') p++; /* internal linkage: a static function */
        if (count++) put_str(o, "::");
        int prefix = 0; /* std::, which a name follows even outside N ... E */
        if (p[0] == 'S' && p[1] == 't') {
            put_str(o, "std");
            p += 2, prefix = 1;
        } else if (!(p = source_name(p, o))) {
            return NULL;
        }
        if (*p == 'I') {
            const char *after = template_args(p, o, depth);
            if (!after) return NULL;
            p = after;
        }
        if (prefix) continue;
        if (!nested) return p;
        if (*p == 'E') return p + 1;
    }
}

void kernel_name(const char *symbol, char *out, size_t n) {
    if (n == 0) return;
    sink o = {out, n, 0};
    out[0] = 0;
    if (!symbol || !symbol[0]) {
        put_str(&o, "?");
        return;
    }
    if (strncmp(symbol, "_Z", 2) == 0) {
        (void)name_at(symbol + 2, &o, 0);
        /* a dangling "::" of a component it could not read */
        if (o.used >= 2 && strcmp(out + o.used - 2, "::") == 0) out[o.used -= 2] = 0;
        if (o.used > 0) return;
    }
    o.used = 0;
    put_str(&o, symbol);
}

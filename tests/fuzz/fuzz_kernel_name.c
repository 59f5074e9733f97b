/* libFuzzer target: kernel_name (engine/kernel_name.c) on any bytes, as a CUPTI kernel
 * record's symbol might hold, into output buffers of sizes 1 to 300: it must return a
 * string shorter than the buffer, without the characters the report cannot carry
 * (whitespace, quotes, backslashes), and never read or write out of bounds (ASan). */
#define _POSIX_C_SOURCE 200809L /* strnlen */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernel_name.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    char *symbol = malloc(n + 1); /* [n + 1] the input, NUL-terminated */
    if (!symbol) return 0;
    memcpy(symbol, data, n);
    symbol[n] = 0;
    char out[300];
    for (size_t size = 1; size <= sizeof out; size += 37) {
        kernel_name(symbol, out, size);
        size_t len = strnlen(out, sizeof out);
        if (len >= size || strpbrk(out, " \t\n\r\"\\")) abort();
    }
    free(symbol);
    return 0;
}

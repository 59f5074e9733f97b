/* libFuzzer target: any bytes as a config file. Must never crash, hang or leak; a bad
 * file is an error message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1); /* [size + 1] NUL-terminated copy */
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    gptc_config c;
    char err[1024];
    config_defaults(&c);
    if (config_load_text(&c, text, err, sizeof(err)) == 0) config_validate(&c, err, sizeof(err));
    free(text);
    return 0;
}

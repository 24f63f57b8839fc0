/* Hostile: asks the zstd helper to decode a buffer into itself. */
#include "spindle_prog.h"

uint64_t spindle_main(const struct spindle_input *in) {
    uint8_t *buf = spindle_alloc(4096);
    for (int i = 0; i < (int)in->data_len && i < 4096; i++)
        buf[i] = in->data[i];
    return spindle_zstd_decompress(buf, in->data_len, buf + 16, 1024);
}

#include "spindle_prog.h"
/* The same count through the vectorised filter helper (a bitmap in scratch memory). */
uint64_t spindle_main(const struct spindle_input *in) {
    const uint32_t *args = (const uint32_t *)in->args;
    if (in->args_len < 8) return 0;
    uint64_t n = in->data_len / 4;
    uint8_t *bits = spindle_alloc((n + 7) / 8);
    struct spindle_filter f = {
        .column = in->data, .n = n, .width = 4, .op = SPINDLE_RANGE,
        .a = args[0], .b = args[1], .out = bits, .and_with = 0,
    };
    return spindle_filter(&f);
}

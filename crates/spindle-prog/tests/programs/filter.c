#include "spindle_prog.h"
/* Values of the u32 column in [a, b] (a and b from the arguments), ANDed with values
 * equal to... nothing: emits the bitmap and returns the count. */
uint64_t spindle_main(const struct spindle_input *in) {
    const uint32_t *args = (const uint32_t *)in->args;
    uint64_t n = in->data_len / 4;
    uint8_t *bits = spindle_alloc((n + 7) / 8);
    struct spindle_filter f = {
        .column = in->data, .n = n, .width = 4, .op = SPINDLE_RANGE,
        .a = args[0], .b = args[1], .out = bits, .and_with = 0,
    };
    int64_t count = spindle_filter(&f);
    spindle_emit(bits, (n + 7) / 8);
    return count;
}

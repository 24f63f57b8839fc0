#include "spindle_prog.h"
/* The sum of the object as a column of u32 values (emitted), and their count. */
uint64_t spindle_main(const struct spindle_input *in) {
    const uint32_t *v = (const uint32_t *)in->data;
    uint64_t n = in->data_len / 4, s = 0;
    for (uint64_t i = 0; i < n; i++) s += v[i];
    spindle_emit(&s, sizeof s);
    return n;
}

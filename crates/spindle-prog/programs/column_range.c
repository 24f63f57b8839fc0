#include "spindle_prog.h"
/* How many u32 values of the object lie in [a, b] (the arguments: two u32), counted in
 * the program itself. */
uint64_t spindle_main(const struct spindle_input *in) {
    const uint32_t *v = (const uint32_t *)in->data;
    const uint32_t *args = (const uint32_t *)in->args;
    if (in->args_len < 8) return 0;
    uint32_t a = args[0], b = args[1];
    uint64_t n = in->data_len / 4, count = 0;
    for (uint64_t i = 0; i < n; i++) count += (v[i] >= a) & (v[i] <= b);
    return count;
}

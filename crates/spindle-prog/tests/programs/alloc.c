#include "spindle_prog.h"
/* Allocates without bound. */
uint64_t spindle_main(const struct spindle_input *in) {
    uint64_t total = 0;
    for (;;) {
        uint8_t *p = spindle_alloc(1 << 20);
        p[0] = 1;
        total += 1 << 20;
    }
    return total;
}

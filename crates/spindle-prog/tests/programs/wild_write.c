#include "spindle_prog.h"
/* Writes to an address nobody mapped. */
uint64_t spindle_main(const struct spindle_input *in) {
    *(volatile uint64_t *)0x700000000ULL = 42;
    return 0;
}

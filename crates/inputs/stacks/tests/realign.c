// A program whose hot path runs under a stack-realigning function: gcc's
// force_align_arg_pointer prologue describes the frame with DWARF
// expressions (CFA = *(rbp - 8), rbp saved at rbp), which the in-kernel
// unwinder does not evaluate. Samples in spin() need the userspace fallback
// to reach main. Built by the test with gcc -O2 (no frame pointers).
#include <string.h>

__attribute__((noinline)) double spin(long n, double x, const char *p)
{
	double acc = 0;
	for (long i = 0; i < n; i++)
		acc += x * i + p[i & 63];
	return acc;
}

__attribute__((noinline, force_align_arg_pointer)) double realigned(long n, double x)
{
	char big[128] __attribute__((aligned(64)));
	memset(big, (int)n, sizeof big);
	return spin(n, x, big) + big[5];
}

int main(int argc, char **argv)
{
	(void)argv;
	volatile double s = 0;
	for (;;)
		s += realigned(argc * 1000000L, 1.5);
}

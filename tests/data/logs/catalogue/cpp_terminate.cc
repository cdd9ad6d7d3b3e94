#include <stdexcept>
#include <cstdio>
int main() { std::puts("step 1"); std::fflush(stdout); throw std::runtime_error("CUDA error: an illegal memory access was encountered"); }

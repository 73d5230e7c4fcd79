//! Device kernels: NVRTC compilation, caching and launch on CUDA; host execution of the same
//! algorithms on the simulator.

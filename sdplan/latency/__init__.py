"""The load-aware latency model of speculative decoding: coefficients, the knee, MoE, the k policy, the grid."""

"""Pinned digests, one place. Each moves only with CONTRACT_VERSION (torch-ext/det_infer/contract.py)
and a docs/SPEC.md change, never to make a test pass.

CONTRACT_MATH_DIGEST: SHA-256 of tests/native/contract_digest.cpp's output (every contract function
over a fixed input set, NaNs canonical). Pinned for CONTRACT_VERSION 1 after gcc, clang, x86-64
baseline/v3/v4, aarch64 (qemu) builds and the kernel's torch ops agreed, and after the functions
were checked against float64/longdouble references with mpmath judging every disagreement
(test_contract_math.py: all within 1 ulp). Regenerate: g++ -O2 -std=c++17 -ffp-contract=off
tests/native/contract_digest.cpp -o d && ./d | sha256sum.
"""
CONTRACT_MATH_DIGEST = "9cf0d03798c5f4c5a3430e7d6b0e0c8635c3ed1223d712682649b8a896969815"

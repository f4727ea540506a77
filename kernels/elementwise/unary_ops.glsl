// The unary maps of UnaryOp (core/ops/elementwise.h), in f32, as backend/cpu/elementwise.cpp computes them.
#ifndef LMTUNE_UNARY_OPS_GLSL
#define LMTUNE_UNARY_OPS_GLSL

// erf to ~1e-7 relative: Taylor series near 0, Numerical Recipes' erfc (fractional error < 1.2e-7) elsewhere.
float erf_f32(float x) {
  float ax = abs(x);
  if (ax < 0.5) {
    float x2 = x * x;
    // 2/sqrt(pi) * (x - x^3/3 + x^5/10 - x^7/42 + x^9/216 - x^11/1320)
    float s = 1.0 + x2 * (-1.0 / 3.0 + x2 * (1.0 / 10.0 + x2 * (-1.0 / 42.0 + x2 * (1.0 / 216.0 + x2 * (-1.0 / 1320.0)))));
    return 1.1283791670955126 * x * s;
  }
  float t = 1.0 / (1.0 + 0.5 * ax);
  float e = t * exp(-ax * ax - 1.26551223 +
                    t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 +
                    t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))));
  float r = 1.0 - e;
  return x < 0.0 ? -r : r;
}

// tanh without inf/inf for large |x| (tanh(+-10) is +-1 in f32).
float tanh_f32(float x) { return tanh(clamp(x, -10.0, 10.0)); }

float unary_op(uint op, float x, float p) {
  switch (op) {
    case 0u: return -x;
    case 1u: return exp(x);
    case 2u: return log(x);
    case 3u: return sqrt(x);
    case 4u: return 1.0 / sqrt(x);
    case 5u: return x * x;
    case 6u: return tanh_f32(x);
    case 7u: return 1.0 / (1.0 + exp(-x));
    case 8u: return x / (1.0 + exp(-x));
    case 9u: return 0.5 * x * (1.0 + tanh_f32(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case 10u: return 0.5 * x * (1.0 + erf_f32(x * 0.7071067811865476));
    case 11u: return erf_f32(x);
    case 12u: return p * x;
    case 13u: return x + p;
  }
  return x;
}

// d act(x) / dx of the gate activations (silu, gelu_tanh, gelu_erf), as backend/cpu/elementwise.cpp computes it.
float gate_derivative(uint op, float x) {
  if (op == 8u) {  // s (1 + x (1 - s))
    float s = 1.0 / (1.0 + exp(-x));
    return s * (1.0 + x * (1.0 - s));
  }
  if (op == 9u) {  // 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2)
    const float c = 0.7978845608028654;
    float t = tanh_f32(c * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
  }
  if (op == 10u)  // Phi(x) + x phi(x)
    return 0.5 * (1.0 + erf_f32(x * 0.7071067811865476)) + x * 0.3989422804014327 * exp(-0.5 * x * x);
  return 0.0;
}

#endif

{
  description = "flash-attn-4-sm120: FlashAttention for consumer Blackwell (SM120) in CuTe DSL";

  inputs = {
    kernel-builder.url = "github:huggingface/kernels";
  };

  outputs =
    { self, kernel-builder }:
    kernel-builder.lib.genKernelFlakeOutputs {
      inherit self;
      path = ./.;
    };
}

"""Explanations of exercise 03's interview questions (`course_utils.quiz.check` prints one when
the learner's answer is right). Each points to the lesson 03 section that shows it."""

EXPLANATIONS = {
    "bf16-halves-memory": (
        "Autocast shrinks only what forward saves for backward, and not even to half: the "
        "residual stream and LayerNorm stay fp32, and it keeps a bf16 copy of each weight it "
        "uses. The parameters stay fp32 (autocast casts per op), and so do their gradients and "
        "AdamW's two moments: 16 bytes per parameter that autocast does not touch. So the peak "
        "falls by less than half where the saved tensors set it (the autocast row of lesson 03, "
        "§2 The ladder), and does not move where the optimizer step sets it (one sequence per "
        "micro-batch at 1B-70B parameters, §6 Memory at scale)."),
    "checkpointing-speeds-training": (
        "Per step, checkpointing is slower: backward runs the forward of every checkpointed "
        "block again, about one more forward per step. What it buys is memory (it keeps each "
        "block's input, not the parameters). It can raise throughput only indirectly: the "
        "memory it frees may admit a larger micro-batch, which may use the hardware better. "
        "Whether that outweighs the recompute is measured per token, each configuration at the "
        "largest batch it fits, timed in alternation (lesson 03, §4 The largest batch under a "
        "memory budget)."),
    "autocast-adamw-bytes": (
        "Under PyTorch autocast the parameters stay fp32 (4 bytes), so do their gradients "
        "(4 bytes), and AdamW keeps two fp32 moments (8 bytes): 16 bytes per parameter. Classic "
        "mixed precision reaches 16 differently: 2 (fp16 weights) + 2 (fp16 gradients) + 4 (fp32 "
        "master copy) + 8 (Adam). Autocast has no separate master copy: the fp32 weights are the "
        "master, cast per op (lesson 03, §6 'Where common byte counts go wrong'). LoRA cuts it by "
        "training few parameters (§7)."),
}

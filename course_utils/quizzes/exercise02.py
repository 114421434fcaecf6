"""Explanations of exercise 02's interview questions (`course_utils.quiz.check` prints one when
the learner's answer is right)."""

EXPLANATIONS = {
    "ckpt-quiz-faster": (
        "In eager mode at a fixed batch, checkpointing only adds work. Each checkpointed block's "
        "forward runs twice, once in the forward pass and again inside backward (the forward-call "
        "counts of Question 1), so the step runs more FLOPs, up to one extra forward of the blocks "
        "(a little less with PyTorch's early stop). On a small or busy machine the extra time can "
        "stay inside the timing noise, which is why lesson 02 section 3 prints it with its noise "
        "band. What checkpointing buys is memory: if the freed memory lets you raise the batch and "
        "the hardware was underused, tokens per second can rise (lesson 03 measures it at the largest "
        "batch under a memory budget). "
        "A compiler is another matter: torch.compile's partitioner recomputes cheap ops where that "
        "is faster than reading them back from memory (lesson 02 section 6, the memory budget)."),
    "ckpt-quiz-what-kept": (
        "A checkpointed region keeps only its inputs and drops every tensor its ops would save; "
        "backward runs the region's forward again from those inputs to rebuild them. The "
        "parameters are not copied: the forward uses them in place, as any forward does. That is "
        "why the kept bytes double when the batch doubles (activations scale with the batch, "
        "parameters do not), as lesson 02 measured in sections 3 ('What stays saved') and 8. "
        "Keeping the matmul outputs, answer (d), is what a selective policy does (Part 3). Storing "
        "parameters and optimizer state is what a training checkpoint on disk does, "
        "torch.save(model.state_dict()): a different thing with a similar name."),
    "ckpt-quiz-extra-flops": (
        "One step costs F + 2F = 3F. One more forward adds F, so the step does F / 3F = 1/3, "
        "about 33 %, more work: the '+33 %' of many posts and the '6ND to 8ND' of the JAX scaling "
        "book. Lesson 02 section 3 ('Where the time goes') counted the real figure with "
        "FlopCounterMode. It comes out lower, because PyTorch's non-reentrant checkpoint stops "
        "recomputing once backward has what it needs, and the parts outside the checkpointed "
        "blocks (embeddings, head, loss) are never recomputed. Time is another matter: small "
        "models spend much of a step outside matmuls, and a shared machine adds noise, so the "
        "published figures for the time it costs were measured on particular hardware."),
}

"""Explanations of exercise 05's interview questions (`course_utils.quiz.check` prints one when
the learner's answer is right)."""

EXPLANATIONS = {
    "ex05-offload-or-recompute": (
        "Offloading costs copies, not FLOPs: every saved byte crosses the link twice per step, once "
        "to the host in forward and once back in backward. 40 GB each way at 25 GB/s is 1.6 s per "
        "direction, 3.2 s in all, more than three times the 1.0 s of compute the copies would have "
        "to hide behind. Full checkpointing instead adds about one forward pass, roughly a third of "
        "the step's FLOPs (lesson 02 counts them): about 0.33 s here. So on this link "
        "recomputation is the cheaper way to free that memory; offloading pays off when the link is "
        "fast next to the compute (NVLink-C2C on a Grace Hopper, or a model whose step does far "
        "more FLOPs per saved byte), and the two combine: offload+checkpoint moves only the block "
        "inputs. Lesson 05 section 6 printed the bytes each policy moves."),
    "ex05-largest-batch": (
        "The peak is linear in the batch: it rose 4 GiB from batch 4 to batch 8, so 1 GiB per "
        "sample, and the line meets batch 0 at 10 - 4 x 1 = 6 GiB (parameters, gradients, optimizer "
        "state and what does not scale). Under 24 GiB: 6 + b x 1 <= 24, so b <= 18. This is the "
        "extrapolation of lesson 05 section 5; its check runs one real step at that batch, because "
        "allocator rounding, fragmentation and a peak that moves to another moment of the step can "
        "bend the line."),
}

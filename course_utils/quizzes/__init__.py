"""Question banks of the exercises' interview questions: one module per exercise, each with
``EXPLANATIONS = {question id: explanation}``, printed by `course_utils.quiz.check` once the
learner's answer is right (kept here so the test cell the learner reads does not give the answer
away). A question id is explained by exactly one bank.
"""

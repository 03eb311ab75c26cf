"""Applications: the top layer. They wire the roles (`learner`, `rollout`,
`reward`, `services`) and the core together and may import anything below them;
nothing below imports them.

`cli/` (the `stare` command), `launch/` (`stare train`'s in-process wiring, `stare up`, the Ray
launcher, role entry points, compose generation), `report/` (summaries, plots, comparisons,
results).
"""

"""The longer --help texts of `stare bench` and `stare doctor`: their benchmarks and checks, read from their
registries so that the help lists exactly what runs."""

from __future__ import annotations


def bench_epilog() -> str:
    from stare.app.bench.registry import BENCHMARKS, SECTIONS

    lines = ["benchmarks (each against a baseline measured in the same run; docs/performance.md):"]
    lines += [f"  {name:<20}{b.summary}" for name, b in BENCHMARKS.items()]
    lines += [
        "sections: " + "; ".join(f"{s} = {' '.join(names)}" for s, names in SECTIONS.items()),
        "The GPU benchmarks print a row saying 'skipped' where CUDA is absent.",
    ]
    return "\n".join(lines)


def doctor_groups() -> list[str]:
    from stare.app.doctor.registry import GROUPS

    return list(GROUPS)


def doctor_epilog() -> str:
    import textwrap

    from stare.app.doctor.registry import GROUPS

    lines = ["checks ([GPU]: skipped without CUDA, saying why; the others run on any machine):"]
    for group in GROUPS.values():
        lines.append(f"{group.name}: {group.summary} (one process, at most {group.timeout_s:.0f} s)")
        for c in group.checks():
            text = f"{c.name}{' [GPU]' if c.gpu else ''}: {c.what}. Fails when: {c.failure}. Fix: {c.fix}."
            lines += textwrap.wrap(text, 110, initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False)
    lines.append("Exit status 1 when a check failed. docs/deploy.md, 'First on a GPU node: stare doctor'.")
    return "\n".join(lines)

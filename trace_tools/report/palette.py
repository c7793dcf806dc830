"""One colour per strategy, the same in the PNG plots and report.html's curves.

matplotlib's tab10 (ten hues that stay apart on white), then two dark hues of tab20b, so that
the twelve built-in strategies never share a colour; beyond that the palette repeats.
"""

STRATEGY_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#637939",
)

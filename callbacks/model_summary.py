"""ModelSummary: Lightning's rich model summary, without a FLOPs column that says 0.

Lightning counts FLOPs only for a model with an ``example_input_array``; for any other it prints a FLOPs column
of zeros and ``Total FLOPs: 0``, which reads as a measurement. This summary leaves the column and the total out
when nothing was counted, and is Lightning's own when something was.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import RichModelSummary
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count


class ModelSummary(RichModelSummary):
    @staticmethod
    def summarize(
        summary_data,
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int = 0,
        **summarize_kwargs,
    ) -> None:
        if total_flops:
            RichModelSummary.summarize(
                summary_data,
                total_parameters,
                trainable_parameters,
                model_size,
                total_training_modes,
                total_flops,
                **summarize_kwargs,
            )
            return
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:  # the first is the layer's index, named " "
            justify = "right" if name in ("Params", "Params per Device") else "left"
            table.add_column(name, justify=justify, style="dim" if name == " " else None)
        for row in zip(*(values for _, values in columns)):
            table.add_row(*row)
        console = get_console()
        console.print(table)
        console.print(
            f"[bold]Trainable params[/]: {get_human_readable_count(int(trainable_parameters))}  "
            f"[bold]Total params[/]: {get_human_readable_count(int(total_parameters))}  "
            f"[bold]Size[/]: {get_formatted_model_size(model_size)} MB"
        )

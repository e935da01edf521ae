"""Page forms. They check shape and units field by field; the core services make the final decision and any
``ValidationError`` they raise is put back on the form's fields (``apply_service_errors``)."""

from __future__ import annotations

import re
from datetime import time
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.utils.translation import ngettext

from portal.control.ladder import ClassTerms, class_policies
from portal.core.events import duration
from portal.core.models import Building, PriorityClass, Provider, ResearchGroup
from portal.core.models.jobs import (
    MAX_JOB_CPU_CORES,
    MAX_JOB_MEMORY_BYTES,
    MIN_JOB_MEMORY_BYTES,
    LossBudgetMode,
)
from portal.core.models.nodes import OwnerUsePolicy
from portal.core.services.gpu_catalogue import GPU_CATALOGUE, lookup_gpu
from portal.core.services.jobs import campus_hardware, campus_limits
from portal.core.snapshots import shared

GB = 1e9
GIB = 2**30
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def apply_service_errors(form: forms.Form, exc: ValidationError, field_map: dict[str, str] | None = None) -> None:
    """Attach a service's ``ValidationError({field: [msg]})`` to the matching form fields (else non-field)."""
    field_map = field_map or {}
    if not hasattr(exc, "error_dict"):
        form.add_error(None, exc)
        return
    for name, errors in exc.message_dict.items():
        target = field_map.get(name, name)
        form.add_error(target if target in form.fields else None, errors)


class RegisterNodeForm(forms.Form):
    provider = forms.ModelChoiceField(queryset=Provider.objects.none(), empty_label=None, label="Lab")
    name = forms.CharField(
        max_length=100, help_text="Host name, e.g. vision-gpu-03 (letters, digits, . _ -).", label="Node name"
    )
    building = forms.ModelChoiceField(queryset=Building.objects.all(), empty_label="Choose a building")
    gpu_model = forms.ChoiceField(label="GPU model", choices=())
    gpu_count = forms.IntegerField(min_value=1, max_value=16, initial=1, label="Number of GPUs")
    gpu_floor = forms.IntegerField(
        min_value=0, max_value=16, initial=0, label="GPUs never lent", help_text="Your guaranteed floor."
    )
    access_link_mbit_s = forms.FloatField(
        min_value=10, max_value=100_000, initial=1000, label="Access link (Mbit/s)"
    )

    def __init__(self, *args: Any, providers: QuerySet[Provider], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["provider"].queryset = providers
        self.fields["gpu_model"].choices = [("", "Choose a model"), *[(m, m) for m in GPU_CATALOGUE]]

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].strip()
        if not NODE_NAME_RE.match(name):
            raise ValidationError("Use letters, digits, dots, dashes or underscores, starting with a letter or digit.")
        return name

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        count, floor = data.get("gpu_count"), data.get("gpu_floor")
        if count is not None and floor is not None and floor > count:
            self.add_error("gpu_floor", ngettext("The floor cannot exceed the node's %(n)d GPU.",
                                                 "The floor cannot exceed the node's %(n)d GPUs.", count) % {"n": count})
        return data

    def service_kwargs(self) -> dict[str, Any]:
        d = self.cleaned_data
        spec = lookup_gpu(d["gpu_model"])
        gpu = {"model": d["gpu_model"]}
        if spec:
            gpu |= {"vram_gb": spec.vram_gb, "compute_capability": spec.compute_capability}
        return {
            "provider": d["provider"],
            "building": d["building"],
            "name": d["name"],
            "gpus": [dict(gpu) for _ in range(d["gpu_count"])],
            "gpu_floor": d["gpu_floor"],
            "access_link_bytes_per_s": d["access_link_mbit_s"] * 1e6 / 8,
        }


class FloorForm(forms.Form):
    gpu_floor = forms.IntegerField(min_value=0, max_value=16, label="GPUs never lent")
    # design §1 "Owner activity and MIG"; optional so that a form without it keeps the node's policy
    owner_use_policy = forms.ChoiceField(
        choices=OwnerUsePolicy.choices, required=False, label="When the lab uses a lent GPU",
        help_text="The agent sees processes on lent GPUs that are no borrowed job's.")


class LendingWindowForm(forms.Form):
    """One weekly window; the page shows several of these as a formset."""

    # The empty choice matters: the page always shows one blank row, and a row whose day defaulted to Monday
    # would count as "changed" and fail on its empty times, refusing a save that only changed the floor.
    weekday = forms.TypedChoiceField(
        choices=[("", "Choose a day"), *enumerate(WEEKDAYS)], coerce=int, empty_value=None, label="Day"
    )
    start_time = forms.TimeField(widget=forms.TimeInput(attrs={"type": "time"}, format="%H:%M"), label="From")
    end_time = forms.TimeField(widget=forms.TimeInput(attrs={"type": "time"}, format="%H:%M"), label="Until")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("start_time") is not None and data.get("start_time") == data.get("end_time"):
            self.add_error("end_time", "A window must not start and end at the same time.")
        return data


LendingWindowFormSet = forms.formset_factory(LendingWindowForm, extra=1, can_delete=True, max_num=21)


def windows_from_formset(formset: forms.BaseFormSet) -> list[dict[str, int | time]]:
    return [
        {"weekday": f.cleaned_data["weekday"], "start_time": f.cleaned_data["start_time"],
         "end_time": f.cleaned_data["end_time"]}
        for f in formset.forms
        if f.has_changed() and f.cleaned_data and not f.cleaned_data.get("DELETE")
    ]


class ReclaimForm(forms.Form):
    """A scheduled reclaim: the notice the provider gives (presets and a custom value, in seconds)."""

    PRESETS = [(30, "30 s"), (120, "2 min"), (600, "10 min"), (1800, "30 min")]

    notice_s = forms.FloatField(
        min_value=1, max_value=7 * 86400, label="Notice (seconds)",
        error_messages={"min_value": "A scheduled reclaim needs a notice of at least 1 s; use emergency for 0."},
    )


class ConfirmForm(forms.Form):
    """Emergency reclaim and kill-switch: the provider must tick the box."""

    confirm = forms.BooleanField(
        required=True,
        error_messages={"required": "Tick the box to confirm: running jobs lose work since their last checkpoint."},
    )


def class_limits_text(terms: list[ClassTerms]) -> str:
    """"Interactive: loans up to 8 h, released after 30 min idle; …" — each class's limits in one line."""
    parts = []
    for t in terms:
        loan = f"loans up to {duration(t.max_loan_s)}" if t.max_loan_s else "no loan limit"
        idle = f"released after {duration(t.idle_limit_s)} idle" if t.idle_watch else "never released for idling"
        gpus = f", at most {t.max_gpus_per_job} GPU{'s' if t.max_gpus_per_job != 1 else ''}" \
            if t.max_gpus_per_job else ""
        parts.append(f"{t.label.capitalize()}: {loan}, {idle}{gpus}")
    return "; ".join(parts) + ". See the ladder for notice and grace."


class JobForm(forms.Form):
    """Job submission in the units people think in (GB, hours, minutes); converted to SI for the service."""

    FRAMEWORKS = [("pytorch", "PyTorch (torch.save)"), ("huggingface", "Hugging Face (save_pretrained)"),
                  ("jax", "JAX / Orbax"), ("other", "other")]

    group = forms.ModelChoiceField(queryset=ResearchGroup.objects.none(), empty_label=None, label="Research group")
    name = forms.CharField(max_length=120, label="Job name")
    gpu_count = forms.IntegerField(min_value=1, max_value=16, initial=1, label="GPUs",
                                   help_text="All on one node; a gang job moves whole.")
    vram_gb_per_gpu = forms.FloatField(min_value=0, max_value=1024, initial=16, label="VRAM per GPU (GB)")
    min_capability = forms.DecimalField(min_value=0, max_value=20, max_digits=4, decimal_places=1, initial=7.0,
                                        label="Minimum compute capability", help_text="e.g. 8.0 for bf16 on A100.")
    framework = forms.ChoiceField(choices=FRAMEWORKS, initial="pytorch")
    command = forms.CharField(max_length=2000, required=False, label="Command",
                              widget=forms.TextInput(attrs={"placeholder": "python train.py --config cfg.yaml"}))
    image = forms.CharField(max_length=300, required=False, label="or container image",
                            help_text="Not run by this campus's agents yet: give a command that starts it.",
                            widget=forms.TextInput(attrs={"placeholder": "registry.campus/nlp/train:1.4"}))
    expected_runtime_h = forms.FloatField(min_value=0.01, max_value=24 * 90, initial=4, label="Expected runtime (h)")
    ckpt_gb = forms.FloatField(min_value=0.001, max_value=2000, initial=3.2, label="Checkpoint size (GB)")
    loss_budget_min = forms.FloatField(min_value=1 / 60, max_value=24 * 60, required=False,
                                       label="Loss budget (min)",
                                       help_text="Most work you accept to lose on an emergency reclaim (optional).")
    loss_budget_mode = forms.ChoiceField(  # design §2 "Loss budget modes"; empty: expected
        choices=LossBudgetMode.choices, initial=LossBudgetMode.EXPECTED, required=False, label="Loss budget means",
        help_text="Expected: on average an interruption loses at most the budget. Bound: no interruption loses "
                  "more than the budget unless its notice makes that impossible (more frequent checkpoints).")
    restart_s = forms.FloatField(min_value=0, max_value=3600, initial=30, label="Restart time (s)")
    priority_class = forms.ChoiceField(choices=PriorityClass.choices, initial=PriorityClass.STANDARD,
                                       label="Priority class")
    output_dir = forms.CharField(max_length=500, required=False, label="Output directory",
                                 help_text="Relative to the job's working directory (e.g. outputs); uploaded to the "
                                           "portal with the final checkpoint when the job ends. Empty: none.",
                                 widget=forms.TextInput(attrs={"placeholder": "outputs"}))
    upload_with_checkpoints = forms.BooleanField(required=False, label="Also upload it at each checkpoint")
    # design §19.2: the job's cgroup limits; empty: the node's per-GPU default
    memory_gib = forms.FloatField(
        min_value=MIN_JOB_MEMORY_BYTES / GIB, max_value=MAX_JOB_MEMORY_BYTES / GIB, required=False,
        label="Memory limit (GiB)",
        help_text="The most memory the job may use (it is stopped beyond it), 0.25 to 16384. Empty: the node's "
                  "default for your number of GPUs.")
    cpu_cores = forms.FloatField(
        max_value=MAX_JOB_CPU_CORES, required=False, label="CPU cores",
        help_text="CPU time the job may use, in cores (e.g. 4, or 0.5). Empty: the node's default for your number "
                  "of GPUs.")

    # The fair queue's fields (design §16.6), checked by portal.queue.submit.
    array = forms.CharField(max_length=200, required=False, label="Array",
                            help_text='One job per index, e.g. "0-49" or "0-49%8" (at most 8 at once); '
                                      "each sees RECLAIMNET_ARRAY_INDEX.",
                            widget=forms.TextInput(attrs={"placeholder": "0-49%8"}))
    after_ok = forms.CharField(max_length=1000, required=False, label="Start after these complete",
                               help_text="Job ids, comma-separated; if one fails this job is cancelled.",
                               widget=forms.TextInput(attrs={"placeholder": "1041, 1042"}))
    after_any = forms.CharField(max_length=1000, required=False, label="Start after these end",
                                help_text="Job ids, comma-separated; however they end.",
                                widget=forms.TextInput(attrs={"placeholder": "1043"}))

    def __init__(self, *args: Any, groups: QuerySet[ResearchGroup], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["group"].queryset = groups
        nodes = shared("campus-hardware", campus_hardware)  # help texts: the shared snapshot (design §9.1)
        if nodes:  # what the campus has, so a request no node could run is not a surprise at submit
            gpus, vram_gb, capability = campus_limits(nodes)
            self.fields["gpu_count"].help_text = (f"All on one node (the largest here has {gpus}); "
                                                  "a gang job moves whole.")
            self.fields["vram_gb_per_gpu"].help_text = f"0 for any; the largest GPU here has {vram_gb:g} GB."
            self.fields["min_capability"].help_text = (f"e.g. 8.0 for bf16 on A100; 0 for any "
                                                       f"(the highest here is {capability}).")
        # Each class's loan and idle limits, before submitting (design §15: the ladder).
        self.class_terms = list(class_policies().values())
        self.fields["priority_class"].help_text = class_limits_text(self.class_terms)

    def clean_cpu_cores(self) -> float | None:
        cores = self.cleaned_data.get("cpu_cores")
        if cores is not None and not cores > 0:
            raise ValidationError("Give more than 0 cores, or leave it empty for the node's default.")
        return cores

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        command, image = (data.get("command") or "").strip(), (data.get("image") or "").strip()
        if not command and not image:
            self.add_error("command", "Give a command or a container image.")
        elif command and image:
            self.add_error("image", "Give a command or a container image, not both: the job would run only the "
                                    "command. Clear one of the two.")
        return data

    def service_kwargs(self) -> dict[str, Any]:
        d = self.cleaned_data
        return {
            "group": d["group"],
            "name": d["name"].strip(),
            "gpu_count": d["gpu_count"],
            "vram_gb_per_gpu": d["vram_gb_per_gpu"],
            "min_capability": d["min_capability"],
            "framework": d["framework"],
            "command": d["command"].strip(),
            "image": d["image"].strip(),
            "expected_runtime_s": d["expected_runtime_h"] * 3600,
            "ckpt_bytes_estimate": int(d["ckpt_gb"] * GB),
            "loss_budget_s": d["loss_budget_min"] * 60 if d.get("loss_budget_min") else None,
            "loss_budget_mode": d.get("loss_budget_mode") or LossBudgetMode.EXPECTED,
            "restart_s": d["restart_s"],
            "priority_class": d["priority_class"],
            "output_dir": (d.get("output_dir") or "").strip(),
            "upload_with_checkpoints": bool(d.get("upload_with_checkpoints")),
            "memory_bytes": None if d.get("memory_gib") is None else round(d["memory_gib"] * GIB),
            "cpu_cores": d.get("cpu_cores"),
        }

    def queue_kwargs(self) -> dict[str, Any]:
        """The fair queue's fields for ``portal.queue.submit.submit_any`` (empty ones left out)."""
        d = self.cleaned_data
        return {k: d[k].strip() for k in ("array", "after_ok", "after_any") if (d.get(k) or "").strip()}

    # Service field names -> form field names, for errors the service raises.
    SERVICE_FIELDS = {
        "expected_runtime_s": "expected_runtime_h",
        "ckpt_bytes_estimate": "ckpt_gb",
        "loss_budget_s": "loss_budget_min",
        "memory_bytes": "memory_gib",
    }

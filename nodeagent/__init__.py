"""ReclaimNet node agent (design §1-§4): runs on each lent GPU node; ``python -m nodeagent``.

``nodeagent.jobkit`` is the job helper library training scripts import (no Django, numpy only).
"""

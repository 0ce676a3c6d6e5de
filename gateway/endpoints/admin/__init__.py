"""The admin API for adapter promotion: policies, versions, approve/reject/promote, rollback,
pause/resume (admin key). The work is done by `apprentice.promotion` (no torch import)."""

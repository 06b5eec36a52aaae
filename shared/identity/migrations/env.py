from shared.identity.models import IdentityBase
from shared.migrate import run_env

run_env(IdentityBase.metadata)

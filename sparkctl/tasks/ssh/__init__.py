"""Phase ssh: a cluster key per node, public keys exchanged, host keys pinned, proven; and its undo."""

from sparkctl.taskgraph.task import Task
from sparkctl.tasks.ssh.down import SshDown
from sparkctl.tasks.ssh.keys import SshKeyTask
from sparkctl.tasks.ssh.mesh import SshMeshTask
from sparkctl.tasks.ssh.verify import SshVerify

TASKS: list[Task] = [SshKeyTask(), SshMeshTask(), SshVerify()]
DOWN_TASKS: list[Task] = [SshDown()]

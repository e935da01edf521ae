# The job state `suspended` (design §15): released by the idle watchdog or the loan timer, resumed by its owner.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0008_job_results'),
    ]

    operations = [
        migrations.AlterField(
            model_name='job',
            name='state',
            field=models.CharField(choices=[('queued', 'queued'), ('running', 'running'), ('migrating', 'migrating'), ('completed', 'completed'), ('failed', 'failed'), ('cancelled', 'cancelled'), ('suspended', 'suspended')], default='queued', max_length=16),
        ),
    ]

locals {
  spot      = var.market == "spot"
  subnet_id = var.subnet_id != null ? var.subnet_id : data.aws_subnet.default[0].id
  # The security group must live in the subnet's VPC: take it from the subnet when one is given.
  vpc_id = (var.vpc_id != null ? var.vpc_id
    : var.subnet_id != null ? data.aws_subnet.given[0].vpc_id
  : data.aws_vpc.default[0].id)
  ami = var.ami != null ? var.ami : data.aws_ami.dlami[0].id
}

data "aws_vpc" "default" {
  count   = var.vpc_id == null && var.subnet_id == null ? 1 : 0
  default = true
}

data "aws_subnet" "given" {
  count = var.vpc_id == null && var.subnet_id != null ? 1 : 0
  id    = var.subnet_id
}

data "aws_subnet" "default" {
  count             = var.subnet_id == null ? 1 : 0
  vpc_id            = local.vpc_id
  availability_zone = var.availability_zone
  default_for_az    = true
}

# The AWS Deep Learning Base AMI (Ubuntu 22.04, x86_64): the NVIDIA driver, fabricmanager, the EFA
# installer and aws-ofi-nccl are already in the image, so a replaced node (market switch,
# preemption) skips the driver's DKMS build (docs.aws.amazon.com/dlami, "Deep Learning Base OSS
# Nvidia Driver GPU AMI (Ubuntu 22.04)"). kit's driver role only checks it.
data "aws_ami" "dlami" {
  count       = var.ami == null ? 1 : 0
  most_recent = true
  owners      = ["amazon"]

  filter {
    name   = "name"
    values = ["Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"]
  }

  filter {
    name   = "architecture"
    values = ["x86_64"]
  }

  filter {
    name   = "state"
    values = ["available"]
  }
}

# Members talk to each other on every port (NCCL, torchrun rendezvous, EFA); SSH only from allowed_cidrs.
# Egress: the cluster itself, plus var.egress_cidrs on every port (packages, images, the watcher's
# agent endpoint, which listens on a port of the user's choosing).
resource "aws_security_group" "this" {
  name        = "${var.cluster_name}-sg"
  description = "kit cluster ${var.cluster_name}: intra-cluster traffic and SSH from allowed CIDRs"
  vpc_id      = local.vpc_id
  tags        = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "self" {
  security_group_id            = aws_security_group.this.id
  description                  = "all traffic between cluster members (NCCL, EFA)"
  ip_protocol                  = "-1"
  referenced_security_group_id = aws_security_group.this.id
  tags                         = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "ssh" {
  for_each          = toset(var.allowed_cidrs)
  security_group_id = aws_security_group.this.id
  description       = "SSH from an allowed CIDR"
  ip_protocol       = "tcp"
  from_port         = 22
  to_port           = 22
  cidr_ipv4         = each.value
  tags              = var.tags
}

resource "aws_vpc_security_group_egress_rule" "self" {
  security_group_id            = aws_security_group.this.id
  description                  = "all traffic between cluster members (EFA needs egress to itself)"
  ip_protocol                  = "-1"
  referenced_security_group_id = aws_security_group.this.id
  tags                         = var.tags
}

resource "aws_vpc_security_group_egress_rule" "out" {
  for_each          = toset(var.egress_cidrs)
  security_group_id = aws_security_group.this.id
  description       = "outbound: package mirrors, images, the kit watcher"
  ip_protocol       = "-1"
  cidr_ipv4         = each.value
  tags              = var.tags
}

# The market as a resource of its own, so that a market change replaces every instance.
# instance_market_options is Optional + Computed + ForceNew in terraform-provider-aws
# (internal/service/ec2/ec2_instance.go): removing the block (spot -> on-demand) keeps the prior
# state value and plans no change at all (hashicorp/terraform-provider-aws#38141). The
# replace_triggered_by below makes both directions a replacement (Terraform docs, "The lifecycle
# meta-argument": replace_triggered_by with terraform_data).
resource "terraform_data" "market" {
  input = var.market
}

resource "aws_key_pair" "this" {
  key_name   = "${var.cluster_name}-key"
  public_key = var.ssh_public_key
  tags       = var.tags
}

# The checkpoint bucket: the nodes' instance profile may list and read/write/delete objects under
# this job's prefix only (least privilege; IAM User Guide, "Amazon S3: Allows read and write access
# to objects in an S3 bucket" with an s3:prefix condition on ListBucket).
resource "aws_iam_role" "node" {
  count       = var.checkpoint_bucket == null ? 0 : 1
  name_prefix = "${var.cluster_name}-node-"
  assume_role_policy = jsonencode({
    Version   = "2012-10-17"
    Statement = [{ Effect = "Allow", Principal = { Service = "ec2.amazonaws.com" }, Action = "sts:AssumeRole" }]
  })
  tags = var.tags
}

resource "aws_iam_role_policy" "checkpoints" {
  count = var.checkpoint_bucket == null ? 0 : 1
  role  = aws_iam_role.node[0].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Effect    = "Allow"
        Action    = ["s3:ListBucket"]
        Resource  = "arn:aws:s3:::${coalesce(var.checkpoint_bucket, "-")}"
        Condition = { StringLike = { "s3:prefix" = ["${var.checkpoint_prefix}/*", var.checkpoint_prefix] } }
      },
      {
        Effect   = "Allow"
        Action   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
        Resource = "arn:aws:s3:::${coalesce(var.checkpoint_bucket, "-")}/${var.checkpoint_prefix}/*"
      },
    ]
  })
}

resource "aws_iam_instance_profile" "node" {
  count       = var.checkpoint_bucket == null ? 0 : 1
  name_prefix = "${var.cluster_name}-node-"
  role        = aws_iam_role.node[0].name
  tags        = var.tags
}

resource "aws_instance" "node" {
  count                  = var.nodes
  ami                    = local.ami
  instance_type          = var.instance_type
  availability_zone      = var.availability_zone
  placement_group        = var.placement_group
  iam_instance_profile   = var.checkpoint_bucket == null ? null : aws_iam_instance_profile.node[0].name
  key_name               = aws_key_pair.this.key_name
  subnet_id              = local.subnet_id
  vpc_security_group_ids = [aws_security_group.this.id]
  ebs_optimized          = true
  monitoring             = var.detailed_monitoring

  # Spot only when the market is spot: a one-time request that terminates on interruption
  # (kit's watcher replaces the node; the data volume lives on in its own state).
  dynamic "instance_market_options" {
    for_each = local.spot ? [1] : []
    content {
      market_type = "spot"
      spot_options {
        instance_interruption_behavior = "terminate"
        spot_instance_type             = "one-time"
        max_price                      = var.max_price == null ? null : tostring(var.max_price)
      }
    }
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required" # IMDSv2 only
    http_put_response_hop_limit = 2
    instance_metadata_tags      = "enabled"
  }

  root_block_device {
    volume_size           = var.root_volume_size_gb
    volume_type           = "gp3"
    encrypted             = true
    delete_on_termination = true
    tags                  = var.tags
  }

  # A newer AMI must not replace running nodes on the next plan (terraform-aws-modules'
  # ignore_ami): a node picks up the current image when it is replaced anyway (market switch,
  # preemption). Roll the image on purpose with `terraform apply -replace=...`.
  lifecycle {
    ignore_changes       = [ami]
    replace_triggered_by = [terraform_data.market]
  }

  tags = merge(var.tags, {
    Name         = "${var.cluster_name}-node-${count.index}"
    "kit:node"   = tostring(count.index)
    "kit:market" = var.market
  })
}

# The attachment belongs to the instance side: replacing an instance replaces only the attachment.
# skip_destroy: never call DetachVolume on a running node. The volume is mounted at /mnt/kit-disk,
# so a detach would hang ("Error waiting for Volume ... to detach", terraform-provider-aws #4770);
# terminating the instance detaches it anyway, and the volume itself lives in the disks state.
resource "aws_volume_attachment" "data" {
  count        = var.nodes
  device_name  = "/dev/sdf"
  volume_id    = var.disk_ids[count.index]
  instance_id  = aws_instance.node[count.index].id
  skip_destroy = true
}

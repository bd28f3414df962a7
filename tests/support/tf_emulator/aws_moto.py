"""The emulator's AWS resources, backed by moto in server mode: what Terraform creates is what
boto3 (kit's watcher) sees. Used when ``$ENDPOINT_ENV`` names the moto server.

Covered: instances (with their spot market), EBS volumes and attachments, security groups and their
rules (``aws_vpc_security_group_ingress_rule`` / ``_egress_rule``), key pairs, and the default VPC /
subnet / an AMI as data sources. Placement groups are kept by the
emulator alone (moto does not implement CreatePlacementGroup). Anything else keeps
the emulator's placeholders. moto's limits apply (docs: docs.getmoto.org, EC2 "implemented
features"): a spot instance is launched at once (no capacity is ever short), and there is no
interruption unless a test terminates the instance itself.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from tf.types import Unknown

ENDPOINT_ENV = "KIT_TF_EMULATOR_AWS_ENDPOINT"


def enabled() -> bool:
    return bool(os.environ.get(ENDPOINT_ENV))


def _tags(state: dict, kind: str) -> list[dict]:
    tags = state.get("tags") or {}
    return [{"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}] if tags else []


def _first(value: Any) -> dict:
    return value[0] if isinstance(value, list) and value else {}


class MotoAWS:
    def __init__(self, region: str) -> None:
        import boto3

        self.ec2 = boto3.client("ec2", region_name=region, endpoint_url=os.environ[ENDPOINT_ENV],
                                aws_access_key_id="testing", aws_secret_access_key="testing")
        self.region = region

    # ----------------------------------------------------------------- create / delete
    def create(self, kind: str, s: dict) -> dict:
        """``s``: the planned state; a computed attribute the config leaves out is still unknown here
        (the provider decides it), so it is not sent to EC2 (e.g. placement_group without a group)."""
        make = getattr(self, f"_create_{kind}", None)
        if make is not None:
            s.update(make({k: v for k, v in s.items() if v is not Unknown}))
        return s

    def delete(self, kind: str, s: dict) -> None:
        ec2 = self.ec2
        if kind == "aws_instance":
            ec2.terminate_instances(InstanceIds=[s["id"]])
        elif kind == "aws_ebs_volume":
            ec2.delete_volume(VolumeId=s["id"])
        elif kind == "aws_key_pair":
            ec2.delete_key_pair(KeyName=s["key_name"])
        elif kind == "aws_security_group":
            ec2.delete_security_group(GroupId=s["id"])
        elif kind == "aws_vpc_security_group_ingress_rule":
            ec2.revoke_security_group_ingress(GroupId=s["security_group_id"], SecurityGroupRuleIds=[s["id"]])
        elif kind == "aws_vpc_security_group_egress_rule":
            ec2.revoke_security_group_egress(GroupId=s["security_group_id"], SecurityGroupRuleIds=[s["id"]])
        elif kind == "aws_volume_attachment" and not s.get("skip_destroy"):
            ec2.detach_volume(VolumeId=s["volume_id"], InstanceId=s["instance_id"], Device=s["device_name"])

    def _create_aws_ebs_volume(self, s: dict) -> dict:
        v = self.ec2.create_volume(AvailabilityZone=s["availability_zone"], Size=int(s["size"]),
                                   VolumeType=s.get("type") or "gp3", Encrypted=bool(s.get("encrypted")),
                                   TagSpecifications=_tags(s, "volume"))
        return {"id": v["VolumeId"], "arn": f"arn:aws:ec2:{self.region}::volume/{v['VolumeId']}"}

    def _create_aws_key_pair(self, s: dict) -> dict:
        k = self.ec2.import_key_pair(KeyName=s["key_name"], PublicKeyMaterial=s["public_key"].encode())
        return {"id": s["key_name"], "key_pair_id": k["KeyPairId"]}

    def _create_aws_security_group(self, s: dict) -> dict:
        name = s.get("name") or f"{s.get('name_prefix') or 'terraform-'}{uuid.uuid4().hex[:12]}"  # as the provider: unique
        g = self.ec2.create_security_group(GroupName=name, Description=s.get("description") or "kit",
                                           VpcId=s["vpc_id"])
        # EC2 gives a new group an allow-all egress rule, which the provider revokes at once
        # (terraform-provider-aws internal/service/ec2/vpc_security_group.go, resourceSecurityGroupCreate):
        # the group has only the rules the configuration declares.
        self.ec2.revoke_security_group_egress(GroupId=g["GroupId"], IpPermissions=[
            {"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}])
        return {"id": g["GroupId"], "name": name}

    def _create_aws_vpc_security_group_ingress_rule(self, s: dict) -> dict:
        return self._rule(self.ec2.authorize_security_group_ingress, s)

    def _create_aws_vpc_security_group_egress_rule(self, s: dict) -> dict:
        return self._rule(self.ec2.authorize_security_group_egress, s)

    def _rule(self, authorize, s: dict) -> dict:
        """One rule, as the provider makes it: one IpPermission (AuthorizeSecurityGroupIngress/Egress), whose
        SecurityGroupRuleId becomes the resource's id."""
        permission: dict[str, Any] = {"IpProtocol": s["ip_protocol"]}
        if s.get("from_port") is not None:
            permission.update(FromPort=int(s["from_port"]), ToPort=int(s["to_port"]))
        if s.get("cidr_ipv4"):
            permission["IpRanges"] = [{"CidrIp": s["cidr_ipv4"], "Description": s.get("description") or ""}]
        if s.get("referenced_security_group_id"):
            permission["UserIdGroupPairs"] = [{"GroupId": s["referenced_security_group_id"]}]
        rule = authorize(GroupId=s["security_group_id"], IpPermissions=[permission])["SecurityGroupRules"][0]
        rid = rule["SecurityGroupRuleId"]
        return {"id": rid, "security_group_rule_id": rid, "arn": f"arn:aws:ec2:{self.region}::security-group-rule/{rid}"}

    def _create_aws_placement_group(self, s: dict) -> dict:
        return {"id": s["name"]}  # moto has no CreatePlacementGroup: kept by the emulator alone

    def _create_aws_volume_attachment(self, s: dict) -> dict:
        self.ec2.attach_volume(Device=s["device_name"], InstanceId=s["instance_id"], VolumeId=s["volume_id"])
        return {"id": f"vai-{abs(hash((s['device_name'], s['instance_id'], s['volume_id'])))}"}

    def _create_aws_instance(self, s: dict) -> dict:
        market = _first(s.get("instance_market_options"))
        args: dict[str, Any] = {
            "ImageId": s["ami"], "InstanceType": s["instance_type"], "MinCount": 1, "MaxCount": 1,
            "SubnetId": s["subnet_id"], "KeyName": s.get("key_name"),
            "SecurityGroupIds": list(s.get("vpc_security_group_ids") or []),
            "TagSpecifications": _tags(s, "instance")}
        if s.get("placement_group"):
            args["Placement"] = {"GroupName": s["placement_group"]}
        if market.get("market_type"):
            args["InstanceMarketOptions"] = {"MarketType": market["market_type"]}
        i = self.ec2.run_instances(**{k: v for k, v in args.items() if v not in (None, [])})["Instances"][0]
        return {"id": i["InstanceId"], "private_ip": i.get("PrivateIpAddress"), "public_ip": i.get("PublicIpAddress"),
                "instance_lifecycle": i.get("InstanceLifecycle"), "availability_zone": i["Placement"]["AvailabilityZone"],
                "instance_state": i["State"]["Name"], "arn": f"arn:aws:ec2:{self.region}::instance/{i['InstanceId']}"}

    def update(self, kind: str, prior: dict, planned: dict) -> dict:
        return planned  # in-place updates (tags) are not sent to moto

    # ----------------------------------------------------------------- read
    def refresh(self, kind: str, s: dict) -> dict | None:
        return s if self.exists(kind, s) else None

    def exists(self, kind: str, s: dict) -> bool:
        """False once the cloud no longer has it (a terminated instance, a deleted volume)."""
        if kind == "aws_instance":
            found = self.ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": [s["id"]]}])
            states = [i["State"]["Name"] for r in found["Reservations"] for i in r["Instances"]]
            return any(x not in ("terminated", "shutting-down") for x in states)
        if kind == "aws_ebs_volume":
            return bool(self.ec2.describe_volumes(Filters=[{"Name": "volume-id", "Values": [s["id"]]}])["Volumes"])
        if kind == "aws_volume_attachment":  # as the provider's read: gone once the volume is not attached there
            vols = self.ec2.describe_volumes(Filters=[{"Name": "volume-id", "Values": [s["volume_id"]]}])["Volumes"]
            return any(a["InstanceId"] == s["instance_id"] and a["State"] in ("attaching", "attached")
                       for v in vols for a in v.get("Attachments", []))
        return True

    def data(self, kind: str, c: dict) -> dict:
        if kind == "aws_vpc":
            vpc = self.ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]
            c.update(id=vpc["VpcId"], cidr_block=vpc["CidrBlock"])
        elif kind == "aws_subnet":
            filters = [{"Name": "availability-zone", "Values": [c["availability_zone"]]},
                       {"Name": "default-for-az", "Values": ["true"]}] if c.get("availability_zone") else \
                [{"Name": "subnet-id", "Values": [c["id"]]}]
            sub = self.ec2.describe_subnets(Filters=filters)["Subnets"][0]
            c.update(id=sub["SubnetId"], vpc_id=sub["VpcId"], cidr_block=sub["CidrBlock"],
                     availability_zone=sub["AvailabilityZone"])
        elif kind == "aws_ami":
            image = self.ec2.describe_images()["Images"][0]  # moto's catalogue has no DLAMI: any image
            c.update(id=image["ImageId"], image_id=image["ImageId"], name=image.get("Name"))
        return c
